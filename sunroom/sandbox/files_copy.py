"""Copying a kernel's workdir files out to a host directory (``sunroom exec --output``).

The paths come from the kernel, so they are not trusted here: each file lands strictly inside
the destination, opened without following a link.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

from sunroom.errors import FileError, UsageError

if TYPE_CHECKING:
    from sunroom.sandbox.files_async import KernelFiles
    from sunroom.sandbox.files_checks import FileInfo

__all__ = ["COPY_MAX_BYTES", "copy_out"]

COPY_MAX_BYTES: Final = 1024 * 1024 * 1024
"""The default cap of the bytes :func:`copy_out` writes in all (1 GiB; ``--output-max-mb``)."""


async def copy_out(
    files: KernelFiles,
    dest: Path,
    globs: Iterable[str] = ("**/*",),
    *,
    max_bytes: int = COPY_MAX_BYTES,
) -> tuple[list[str], list[str]]:
    """Copy the workdir files matching any of *globs* into the host directory *dest*.

    Returns (copied, skipped) workdir paths; a file the kernel refuses to read (a link out of
    the workdir) is skipped. The paths come from the kernel, so they are checked again here: a
    file lands strictly inside *dest* (made if missing), is opened without following a link,
    and replaces what was there.

    At most *max_bytes* (default :data:`COPY_MAX_BYTES`, 1 GiB) are written in all: when the
    listed sizes add up to more, FileError(reason="too_big") is raised before anything is
    copied, and when a file's size at open (the kernel may list one size and open another)
    would take the total past it, it is raised before that file is read. Each file is read
    only up to its size at open (:meth:`KernelFiles.read_sized`): a kernel sending more breaks
    the protocol (ProtocolError). A file whose copy fails midway is removed, the ones copied
    before it are kept. Raises FileError, UsageError (a path that would leave *dest*, a bad
    *max_bytes*), ProtocolError, OSError from the host's own filesystem, and what the
    kernel's calls raise.
    """
    if type(max_bytes) is not int or max_bytes < 0:
        raise UsageError("max_bytes must be an int >= 0")
    root = _made(dest)
    seen: dict[str, FileInfo] = {}
    for pattern in globs:
        for info in await files.list(pattern):
            seen.setdefault(info.path, info)
    listed = sum(info.size for info in seen.values() if not info.is_dir)
    if listed > max_bytes:
        raise FileError(
            f"the files to copy hold {listed} bytes, over the limit of {max_bytes}; nothing "
            "was copied",
            reason="too_big",
        )
    copied: list[str] = []
    skipped: list[str] = []
    total = 0
    for rel in sorted(seen):
        if seen[rel].is_dir:
            continue
        try:
            size, stream = await files.read_sized(rel)
        except FileError as exc:
            if exc.reason != "refused":
                raise
            skipped.append(rel)
            continue
        try:
            if total + size > max_bytes:
                raise FileError(
                    f"{rel} is {size} bytes, which takes the copy past its limit of "
                    f"{max_bytes} bytes; {len(copied)} files were copied",
                    reason="too_big",
                )
            await _copy(root, rel, stream)
        finally:
            await stream.aclose()
        total += size
        copied.append(rel)
    return copied, skipped


async def _copy(root: Path, rel: str, stream: AsyncIterator[bytes]) -> None:
    """Write *stream* to the host file for *rel*; the file is removed when that fails."""
    with _target(root, rel) as out:
        try:
            async for chunk in stream:
                out.write(chunk)
        except BaseException:
            os.unlink(root / rel)  # made just now, inside root (checked by _target)
            raise


def _made(dest: Path) -> Path:
    root = dest.resolve()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _target(root: Path, rel: str) -> BinaryIO:
    """The host file for workdir path *rel* under *root*, opened for writing (no link)."""
    target = root / rel
    if not target.parent.resolve().is_relative_to(root):
        raise UsageError("a workdir file would be copied outside the output directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.fdopen(os.open(target, flags, 0o644), "wb")
