"""Copying a kernel's workdir files out to a host directory (``sunroom run --output``).

The paths come from the kernel, so they are not trusted here: each file lands strictly inside
the destination, opened without following a link.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from sunroom.errors import FileError, UsageError

if TYPE_CHECKING:
    from sunroom.sandbox.files import KernelFiles
    from sunroom.sandbox.files_checks import FileInfo


async def copy_out(
    files: KernelFiles, dest: Path, globs: Iterable[str] = ("**/*",)
) -> tuple[list[str], list[str]]:
    """Copy the workdir files matching any of *globs* into the host directory *dest*.

    Returns (copied, skipped) workdir paths; a file the kernel refuses to read (a link out of
    the workdir) is skipped. The paths come from the kernel, so they are checked again here: a
    file lands strictly inside *dest* (made if missing), is opened without following a link,
    and replaces what was there. Raises FileError, UsageError (a path that would leave
    *dest*), OSError from the host's own filesystem, and what the kernel's calls raise.
    """
    root = _made(dest)
    seen: dict[str, FileInfo] = {}
    for pattern in globs:
        for info in await files.list(pattern):
            seen.setdefault(info.path, info)
    copied, skipped = [], []
    for rel in sorted(seen):
        if seen[rel].is_dir:
            continue
        try:
            stream = files.read_stream(rel)
            first = await anext(stream, b"")
        except FileError as exc:
            if exc.reason != "refused":
                raise
            skipped.append(rel)
            continue
        with _target(root, rel) as out:
            out.write(first)
            async for chunk in stream:
                out.write(chunk)
        copied.append(rel)
    return copied, skipped


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
