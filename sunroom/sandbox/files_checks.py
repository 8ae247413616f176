"""What ``kernel.files`` checks: workdir paths before they are sent, answers when they arrive.

A path is refused on the host before any request (:func:`check_path`: absolute, ``..``, NUL, the
workdir itself), and the kernel checks it again. The kernel is not trusted, so every answer to a
``file_*`` request is checked against its shape by one of the ``check_*`` functions here, passed
as the ``check`` of the channel's call: an answer out of shape raises WireError, which the
channel turns into a ProtocolError (and closes). A listing's paths must be normalized and stay
inside the workdir; they become :class:`FileInfo` entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypedDict, cast, final

from sunroom.errors import FileError, UsageError
from sunroom.prelude.files import MAX_LIST, PathRefused, normalize
from sunroom.rpc.codec import WireError

READ_MAX_BYTES: Final = 1024 * 1024 * 1024
"""The default cap of ``kernel.files.read`` (1 GiB): the most one call holds in memory."""


class FileInfoData(TypedDict):
    """A :class:`FileInfo` as JSON-ready data."""

    path: str
    size: int
    mtime: float
    is_dir: bool


@final
@dataclass(frozen=True, slots=True)
class FileInfo:
    """One entry of a listing: its workdir-relative path, size in bytes, mtime (epoch s)."""

    path: str
    size: int
    mtime: float
    is_dir: bool

    def to_dict(self) -> FileInfoData:
        """The entry as JSON-ready data."""
        return {"path": self.path, "size": self.size, "mtime": self.mtime, "is_dir": self.is_dir}


def check_path(path: str) -> str:
    """*path* normalized (``a/b``); raises FileError(reason="refused") or UsageError."""
    if not isinstance(path, str):
        raise UsageError("a workdir path must be a str")
    try:
        return normalize(path)
    except PathRefused as exc:
        raise FileError(str(exc), reason="refused") from None


# -- the checks of the kernel's answers ----------------------------------------------------------


def check_opened(result: object) -> dict[str, int]:
    """The answer to ``file_*_open``: its ``handle`` and ``size`` (0 when not sent)."""
    if type(result) is not dict:
        raise WireError("a file open result must be a map")
    handle, size = result.get("handle"), result.get("size", 0)
    if type(handle) is not int or type(size) is not int or size < 0:
        raise WireError("a file open result must hold an int handle and a size >= 0")
    return {"handle": handle, "size": size}


def check_shared(result: object) -> dict[str, int]:
    """The answer to a shared ``file_read_open``: :func:`check_opened`'s, with fd, dev, ino."""
    opened = check_opened(result)
    assert isinstance(result, dict)  # check_opened refused anything else
    for key in ("fd", "dev", "ino"):
        value = result.get(key)
        if type(value) is not int or value < 0:
            raise WireError("a shared file open result must hold ints fd, dev and ino >= 0")
        opened[key] = value
    return opened


def check_written(result: object) -> int:
    """The answer to ``file_write_chunk`` or ``file_write_close``: a byte count."""
    if type(result) is not int or result < 0:
        raise WireError("a file write result must be an int >= 0")
    return result


def check_nil(result: object) -> None:
    """The answer to ``file_read_close`` or ``file_delete``: nil."""
    if result is not None:
        raise WireError("a file close or delete result must be nil")


@final
class ReadBudget:
    """What one read may still receive: the size the kernel reported when it opened the file.

    The one bound of every host-side read of a kernel's file (``read``, ``read_stream``,
    ``read_sized``, so ``copy_out`` and the download route too): each answer to
    ``file_read_chunk`` is checked by :meth:`check` as it arrives, before anything uses it.
    The kernel serves a file only up to its size at open (a file that grew is cut there), so
    a byte past that size is the kernel breaking the protocol: WireError, which the channel
    turns into a ProtocolError, closing it (the kernel starts afresh on next use). So nothing
    past the reported size is ever kept, written or yielded, however long the kernel sends.
    """

    __slots__ = ("left", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.left = size

    def check(self, asked: int) -> Callable[[object], bytes]:
        """The check of an answer to a ``file_read_chunk`` asking for *asked* bytes."""

        def check(result: object) -> bytes:
            if type(result) is not bytes:
                raise WireError("a file read result must be bytes")
            if len(result) > asked:
                raise WireError(f"a file read result must be at most {asked} bytes")
            if len(result) > self.left:
                raise WireError(
                    f"the kernel sent more than the {self.size} bytes it reported for the file"
                )
            self.left -= len(result)
            return result

        return check


def check_listing(result: object) -> list[FileInfo]:
    """The answer to ``file_list``: its entries, each path normalized and inside the workdir."""
    if type(result) is not list:
        raise WireError("a file listing must be a list")
    if len(result) > MAX_LIST:
        raise WireError(f"a file listing must have at most {MAX_LIST} entries")
    out = []
    for row in result:
        if type(row) is not dict:
            raise WireError("a file listing entry must be a map")
        path, size, is_dir = row.get("path"), row.get("size"), row.get("is_dir")
        mtime = row.get("mtime")
        if type(path) is not str or not path or len(path) > 4096:
            raise WireError("a file listing path must be a non-empty str")
        try:
            if normalize(path) != path:
                raise WireError("a file listing path must be normalized")
        except PathRefused:  # '..', absolute, NUL: never used on the host
            raise WireError("a file listing path must stay inside the workdir") from None
        if type(size) is not int or size < 0:
            raise WireError("a file listing size must be an int >= 0")
        if type(mtime) not in (int, float) or not math.isfinite(cast(float, mtime)):
            raise WireError("a file listing mtime must be a finite number")
        if type(is_dir) is not bool:
            raise WireError("a file listing is_dir must be a bool")
        out.append(FileInfo(path, size, float(cast(float, mtime)), is_dir))
    return out
