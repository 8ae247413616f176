"""``kernel.files``: the files of a kernel's workdir, moved through its channel in chunks.

The workdir of the bwrap and docker backends lives inside the sandbox, so the host never opens
a workdir path itself (it could be led into host files by a link the kernel planted): every
operation is a ``file_*`` request the kernel runtime serves (:mod:`sunroom.prelude.files`, which
resolves paths beneath the workdir), and the data travels as frames of at most
:data:`CHUNK_BYTES` (less when ``Limits.max_frame_bytes`` is small), a few in flight at a time.
:meth:`KernelFiles.open_shared` is the one way around the channel for data, never for paths:
the kernel opens the file in its jail and this process takes the kernel's own descriptor
(:mod:`sunroom.sandbox.fdtake`), for the download route's ``sendfile``.

Paths are relative to the workdir; an absolute path, a ``..`` component, a NUL or the workdir
itself is refused here before anything is sent, and the kernel checks again. Every answer is
checked against its expected shape (the kernel is not trusted): a bad one is a ProtocolError.

Cells and file operations: an operation takes the kernel's cell lock for its whole length, so it
waits for a running cell to end and a cell waits for a running transfer (a cell never sees a
half-written file, and transfers never mix with a cell's traffic). Do not call these from a host
function while its cell runs: that would wait for itself.

This module gathers the parts' public names: the async operations are
:mod:`sunroom.sandbox.files_async`, the checks of paths and answers
:mod:`sunroom.sandbox.files_checks`, the blocking twin :mod:`sunroom.sandbox.files_sync`, the
copy to a host directory :mod:`sunroom.sandbox.files_copy`.
"""

from sunroom.sandbox.files_async import CHUNK_BYTES, WINDOW, KernelFiles, SharedFile
from sunroom.sandbox.files_checks import READ_MAX_BYTES, FileInfo
from sunroom.sandbox.files_copy import COPY_MAX_BYTES, copy_out
from sunroom.sandbox.files_sync import BlockingSharedFile, Files

__all__ = [
    "CHUNK_BYTES",
    "COPY_MAX_BYTES",
    "READ_MAX_BYTES",
    "WINDOW",
    "BlockingSharedFile",
    "FileInfo",
    "Files",
    "KernelFiles",
    "SharedFile",
    "copy_out",
]
