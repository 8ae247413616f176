"""The blocking twins of ``kernel.files``: the same methods, run on the kernel's portal.

:class:`Files` (``Kernel.files``) mirrors :class:`~sunroom.sandbox.files.KernelFiles` and
:class:`BlockingSharedFile` mirrors :class:`~sunroom.sandbox.files.SharedFile`, with the same
errors.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, final

from sunroom.sandbox.files_checks import READ_MAX_BYTES

if TYPE_CHECKING:
    from sunroom.sandbox.files_async import KernelFiles, SharedFile
    from sunroom.sandbox.files_checks import FileInfo
    from sunroom.sandbox.portal import Portal


@final
class Files:
    """The blocking twin of :class:`KernelFiles` (``Kernel.files``); same methods, same errors."""

    def __init__(self, portal: Portal, core: KernelFiles) -> None:
        self._portal = portal
        self._core = core

    def write(self, path: str, data: bytes | Iterable[bytes]) -> int:
        """Write *data* (bytes or an iterable of bytes) to *path*; see ``KernelFiles.write``."""
        if isinstance(data, bytes | bytearray | memoryview):
            return self._portal.call(self._core.write(path, bytes(data)))
        return self._portal.call(self._core.write(path, _pieces(iter(data))))

    def read(self, path: str, *, max_bytes: int = READ_MAX_BYTES) -> bytes:
        """The content of *path*, at most *max_bytes* (1 GiB); see ``KernelFiles.read``."""
        return self._portal.call(self._core.read(path, max_bytes=max_bytes))

    def read_stream(self, path: str) -> Iterator[bytes]:
        """The content of *path* chunk by chunk; see ``KernelFiles.read_stream``."""
        return self._chunks(self._core.read_stream(path))

    def read_sized(self, path: str) -> tuple[int, Generator[bytes, None, None]]:
        """The size of *path* when opened, and its content; see ``KernelFiles.read_sized``.

        The kernel is held until the iterator ends or is closed (``close()``).
        """
        size, stream = self._portal.call(self._core.read_sized(path))
        chunks = self._chunks(stream, primed=True)
        next(chunks)  # to its first yield: from here on, closing it closes the stream
        return size, chunks

    def _chunks(
        self, stream: AsyncGenerator[bytes, None], *, primed: bool = False
    ) -> Generator[bytes, None, None]:
        """The blocking iteration of *stream*; closing it closes *stream*.

        *primed*: it first yields ``b""`` for the caller to take at once (not a chunk).
        """
        try:
            if primed:
                yield b""
            while True:
                try:
                    chunk = self._portal.call(_next(stream))
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            self._portal.call(stream.aclose())

    def open_shared(self, path: str) -> BlockingSharedFile | None:
        """*path* opened by the kernel, taken into this process; see ``KernelFiles.open_shared``.

        The kernel is held until the result is closed (``close()``, or a ``with`` block).
        """
        shared = self._portal.call(self._core.open_shared(path))
        return None if shared is None else BlockingSharedFile(self._portal, shared)

    def list(self, glob: str = "**/*") -> list[FileInfo]:
        """Entries matching *glob*; see ``KernelFiles.list``."""
        return self._portal.call(self._core.list(glob))

    def delete(self, path: str) -> None:
        """Remove *path*; see ``KernelFiles.delete``."""
        self._portal.call(self._core.delete(path))


@final
class BlockingSharedFile:
    """The blocking twin of :class:`SharedFile` (``Files.open_shared``): ``fd``, ``size``."""

    def __init__(self, portal: Portal, core: SharedFile) -> None:
        self.fd = core.fd
        self.size = core.size
        self._portal = portal
        self._core = core

    def close(self) -> None:
        """Close the descriptor and release the kernel. Idempotent."""
        self._portal.call(self._core.aclose())

    def __enter__(self) -> BlockingSharedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _pieces(source: Iterator[bytes]) -> AsyncIterator[bytes]:
    for piece in source:  # runs on the kernel's loop thread, between chunks sent
        yield piece


async def _next(stream: AsyncIterator[bytes]) -> bytes:
    return await anext(stream)
