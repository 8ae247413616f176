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
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Generator,
    Iterable,
    Iterator,
)
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Final, cast, final

from sunroom.errors import ClosedError, FileError, KernelError, UsageError
from sunroom.prelude.files import MAX_GLOB, MAX_LIST, PathRefused, normalize
from sunroom.rpc.channel import RemoteError, cut
from sunroom.rpc.codec import WireError
from sunroom.sandbox import fdtake

if TYPE_CHECKING:
    import asyncio

    from sunroom.rpc.channel import Channel
    from sunroom.sandbox.kernel import AsyncKernel
    from sunroom.sandbox.portal import Portal

__all__ = [
    "CHUNK_BYTES",
    "BlockingSharedFile",
    "FileInfo",
    "Files",
    "KernelFiles",
    "SharedFile",
    "copy_out",
]

CHUNK_BYTES: Final = 1024 * 1024
"""Data bytes in one frame of a transfer."""

WINDOW: Final = 4
"""Chunks of one transfer in flight at once."""

_REASONS: Final = {
    "PathRefused": "refused",
    "NotFound": "not_found",
    "IsDirectory": "is_dir",
    "NotDirectory": "not_dir",
    "NoSpace": "no_space",
    "TooMany": "too_many",
}


@final
@dataclass(frozen=True, slots=True)
class FileInfo:
    """One entry of a listing: its workdir-relative path, size in bytes, mtime (epoch s)."""

    path: str
    size: int
    mtime: float
    is_dir: bool

    def to_dict(self) -> dict[str, Any]:
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


def _handle(result: Any) -> dict[str, int]:
    if type(result) is not dict:
        raise WireError("a file open result must be a map")
    handle, size = result.get("handle"), result.get("size", 0)
    if type(handle) is not int or type(size) is not int or size < 0:
        raise WireError("a file open result must hold an int handle and a size >= 0")
    return {"handle": handle, "size": size}


def _shared(result: Any) -> dict[str, int]:
    opened = _handle(result)
    for key in ("fd", "dev", "ino"):
        value = result.get(key)
        if type(value) is not int or value < 0:
            raise WireError("a shared file open result must hold ints fd, dev and ino >= 0")
        opened[key] = value
    return opened


def _count(result: Any) -> int:
    if type(result) is not int or result < 0:
        raise WireError("a file write result must be an int >= 0")
    return result


def _none(result: Any) -> None:
    if result is not None:
        raise WireError("a file close or delete result must be nil")


def _chunk_of(size: int) -> Any:
    def check(result: Any) -> bytes:
        if type(result) is not bytes:
            raise WireError("a file read result must be bytes")
        if len(result) > size:
            raise WireError(f"a file read result must be at most {size} bytes")
        return result

    return check


def _listing(result: Any) -> list[FileInfo]:
    if type(result) is not list:
        raise WireError("a file listing must be a list")
    if len(result) > MAX_LIST:
        raise WireError(f"a file listing must have at most {MAX_LIST} entries")
    out = []
    for row in result:
        if type(row) is not dict:
            raise WireError("a file listing entry must be a map")
        path, size, is_dir = row.get("path"), row.get("size"), row.get("is_dir")
        mtime: Any = row.get("mtime")
        if type(path) is not str or not path or len(path) > 4096:
            raise WireError("a file listing path must be a non-empty str")
        try:
            if normalize(path) != path:
                raise WireError("a file listing path must be normalized")
        except PathRefused:  # '..', absolute, NUL: never used on the host
            raise WireError("a file listing path must stay inside the workdir") from None
        if type(size) is not int or size < 0:
            raise WireError("a file listing size must be an int >= 0")
        if type(mtime) not in (int, float) or not math.isfinite(mtime):
            raise WireError("a file listing mtime must be a finite number")
        if type(is_dir) is not bool:
            raise WireError("a file listing is_dir must be a bool")
        out.append(FileInfo(path, size, float(mtime), is_dir))
    return out


@final
class SharedFile:
    """A workdir file the kernel opened, taken into this process (``KernelFiles.open_shared``).

    ``fd`` reads the file (this object's: do not close it); ``size`` is the file's size when it
    was taken. The kernel is held (no cell runs) until :meth:`aclose`, which closes ``fd``.
    """

    def __init__(self, fd: int, size: int, hold: AsyncGenerator[Any, None]) -> None:
        self.fd = fd
        self.size = size
        self._hold = hold

    async def aclose(self) -> None:
        """Close the descriptor and release the kernel. Idempotent."""
        await self._hold.aclose()

    async def __aenter__(self) -> SharedFile:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- the async API -------------------------------------------------------------------------------


@final
class KernelFiles:
    """The workdir of one :class:`~sunroom.sandbox.kernel.AsyncKernel` (``kernel.files``).

    Every method starts the kernel when it is not running. Errors: FileError (with a
    ``reason``) for a refused path or a failed operation, the kernel still running;
    KernelDiedError when the kernel dies meanwhile (it starts afresh on next use, with an empty
    workdir); ProtocolError when it answers out of shape; ClosedError after close.
    """

    def __init__(self, kernel: AsyncKernel) -> None:
        self._kernel = kernel

    def _chunk_bytes(self) -> int:
        return min(CHUNK_BYTES, self._kernel.limits.max_frame_bytes // 2)

    async def _channel(self) -> Channel:
        await self._kernel._ensure()  # noqa: SLF001 - the kernel's own helper
        channel = self._kernel._channel  # noqa: SLF001
        assert channel is not None
        return channel

    async def _failed(self, what: str, exc: BaseException) -> BaseException:
        """The error to raise for *exc*, a failure of the kernel's answer to *what*."""
        if isinstance(exc, RemoteError):
            reason = _REASONS.get(exc.error.type, "failed")
            return FileError(cut(exc.error.message, 200), reason=reason)
        if isinstance(exc, ClosedError | ConnectionError):
            return await self._kernel._died(what, exc)  # noqa: SLF001
        return exc

    async def write(self, path: str, data: bytes | AsyncIterable[bytes]) -> int:
        """Write *data* to the workdir file *path*; returns the bytes written.

        Missing parent directories are made. The data goes to a hidden temporary file that is
        renamed over *path* only once all of it arrived: when *data* raises (its exception
        propagates), or the write fails, nothing at *path* changes and the temporary file is
        removed. An existing file is replaced; a directory at *path* is an error.
        """
        rel = check_path(path)
        if isinstance(data, bytes | bytearray | memoryview):
            data = _once(bytes(data))
        elif not isinstance(data, AsyncIterable):
            raise UsageError("data must be bytes or an async iterable of bytes")
        size = self._chunk_bytes()
        async with self._kernel._lock:  # noqa: SLF001 - serialised with cells
            channel = await self._channel()
            try:
                opened = await channel.call("file_write_open", {"path": rel}, check=_handle)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.write", exc) from None
            handle = opened["handle"]
            flight: deque[asyncio.Future[Any]] = deque()
            parts: list[memoryview] = []  # the next chunk: views of the pieces, not copies
            filled = 0
            committed = False
            try:
                async for piece in data:
                    if not isinstance(piece, bytes | bytearray | memoryview):
                        raise UsageError("data must yield bytes")
                    view = memoryview(piece).cast("B")
                    while view:
                        take = min(size - filled, len(view))
                        parts.append(view[:take])
                        view = view[take:]
                        filled += take
                        if filled == size:
                            await self._send(channel, flight, handle, parts)
                            parts, filled = [], 0
                    if parts and not parts[-1].readonly:  # the caller may reuse its buffer
                        parts = [p if p.readonly else memoryview(bytes(p)) for p in parts]
                if parts:
                    await self._send(channel, flight, handle, parts)
                while flight:
                    await flight.popleft()
                committed = True
                params = {"handle": handle, "commit": True}
                return await channel.call("file_write_close", params, check=_count)  # type: ignore[no-any-return]
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.write", exc) from None
            finally:
                if not committed:
                    await _abort(channel, flight, handle)

    async def _send(
        self,
        channel: Channel,
        flight: deque[asyncio.Future[Any]],
        handle: int,
        chunk: list[memoryview],
    ) -> None:
        """Send one chunk (its parts written as they are: they may change once this returns)."""
        if len(flight) >= WINDOW:
            await flight.popleft()
        params = {"handle": handle, "data": b""}  # the data: the parts, as one binary
        flight.append(channel.request("file_write_chunk", params, check=_count, tail=chunk))

    async def read(self, path: str) -> bytes:
        """The whole content of the workdir file *path* (see :meth:`read_stream` for big files)."""
        out = bytearray()
        async for chunk in self.read_stream(path):
            out += chunk
        return bytes(out)

    async def read_stream(self, path: str) -> AsyncGenerator[bytes, None]:
        """The content of the workdir file *path*, chunk by chunk (at most 1 MiB each).

        The kernel is held (no cell runs) until the iterator ends or is closed; close it
        (``contextlib.aclosing``) when stopping early. A missing file raises on the first step.
        """
        stream = self._reader(path)
        try:
            await anext(stream)  # the size
            async for chunk in stream:
                yield cast(bytes, chunk)
        finally:
            await stream.aclose()

    async def read_sized(self, path: str) -> tuple[int, AsyncGenerator[bytes, None]]:
        """The size of the workdir file *path* when it was opened, and its content stream.

        The stream is :meth:`read_stream`'s, already started: the kernel is held until it ends
        or is closed, so close it (``aclose``). It reads to the end of the file, which may
        have grown or shrunk since it was opened. A missing file raises here.
        """
        stream = self._reader(path)
        size = await anext(stream)
        return cast(int, size), cast(AsyncGenerator[bytes, None], stream)

    async def _reader(self, path: str) -> AsyncGenerator[int | bytes, None]:
        """The file's size when opened, then its chunks (the steps of :meth:`read_stream`)."""
        rel = check_path(path)
        size = self._chunk_bytes()
        check = _chunk_of(size)
        async with self._kernel._lock:  # noqa: SLF001 - serialised with cells
            channel = await self._channel()
            try:
                opened = await channel.call("file_read_open", {"path": rel}, check=_handle)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.read", exc) from None
            handle = opened["handle"]
            flight: deque[asyncio.Future[Any]] = deque()
            params = {"handle": handle, "size": size}
            ended = False
            try:
                yield opened["size"]
                while True:
                    while not ended and len(flight) < WINDOW:
                        flight.append(channel.request("file_read_chunk", params, check=check))
                    if not flight:
                        break
                    try:
                        chunk = await flight.popleft()
                    except (RemoteError, ClosedError, ConnectionError) as exc:
                        raise await self._failed("files.read", exc) from None
                    if not chunk:
                        ended = True
                        continue
                    yield chunk
            finally:
                await _drain(flight)
                if not channel.closed.done():
                    try:
                        await channel.call("file_read_close", {"handle": handle}, check=_none)
                    except RemoteError as exc:
                        raise await self._failed("files.read", exc) from None

    async def open_shared(self, path: str) -> SharedFile | None:
        """The workdir file *path*, opened by the kernel and taken into this process.

        For sending a file without passing its bytes through the channel (the download route
        uses it with ``sendfile``). The kernel opens *path* in its jail exactly as for
        :meth:`read_stream` and this process takes the kernel's descriptor
        (:mod:`sunroom.sandbox.fdtake`); no path is resolved on the host. The kernel is held
        (no cell runs) until the result is closed (``aclose``). None when this kernel's
        descriptors cannot be taken (a docker kernel that never forked: its runtime's host pid
        is unknown; no ``pidfd_getfd`` or no ptrace access): use :meth:`read_sized`.
        Errors as :meth:`read_stream`'s; a missing file raises here.
        """
        if not fdtake.available():
            return None
        stream = self._sharer(path)
        got = await anext(stream)
        if got is None:
            await stream.aclose()
            return None
        return SharedFile(got[0], got[1], stream)

    async def _sharer(self, path: str) -> AsyncGenerator[tuple[int, int] | None, None]:
        """The taken descriptor and the file's size (or None), held until closed."""
        rel = check_path(path)
        async with self._kernel._lock:  # noqa: SLF001 - serialised with cells
            channel = await self._channel()
            pid = getattr(self._kernel.process, "host_pid", None)
            if pid is None:
                yield None
                return
            try:
                params = {"path": rel, "share": True}
                opened = await channel.call("file_read_open", params, check=_shared)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.read", exc) from None
            try:
                try:
                    fd = fdtake.take(pid, opened["fd"], dev=opened["dev"], ino=opened["ino"])
                except OSError:  # no ptrace access to this runtime: the caller reads instead
                    yield None
                    return
                try:
                    yield fd, os.fstat(fd).st_size
                finally:
                    os.close(fd)
            finally:
                if not channel.closed.done():
                    params = {"handle": opened["handle"]}
                    try:
                        await channel.call("file_read_close", params, check=_none)
                    except RemoteError as exc:
                        raise await self._failed("files.read", exc) from None

    async def list(self, glob: str = "**/*") -> list[FileInfo]:
        """Entries of the workdir whose relative path matches *glob*, sorted by path.

        ``**`` spans directories, ``*`` and ``?`` do not. Links are listed as themselves
        (never followed); more than 10,000 matches is a FileError(reason="too_many").
        """
        if not isinstance(glob, str) or len(glob) > MAX_GLOB or "\x00" in glob:
            raise UsageError(f"glob must be a str of at most {MAX_GLOB} characters without NUL")
        async with self._kernel._lock:  # noqa: SLF001
            channel = await self._channel()
            try:
                return await channel.call("file_list", {"glob": glob}, check=_listing)  # type: ignore[no-any-return]
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.list", exc) from None

    async def delete(self, path: str) -> None:
        """Remove the file, link (never its target) or directory tree at *path*."""
        rel = check_path(path)
        async with self._kernel._lock:  # noqa: SLF001
            channel = await self._channel()
            try:
                await channel.call("file_delete", {"path": rel}, check=_none)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.delete", exc) from None


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


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _drain(flight: deque[asyncio.Future[Any]]) -> None:
    """Wait for the answers still due (their errors are the transfer's, raised already)."""
    while flight:
        fut = flight.popleft()
        try:
            await fut
        except (RemoteError, ClosedError, ConnectionError, KernelError):
            continue  # reported by whoever failed first, or moot: the transfer is over
        except Exception:  # noqa: BLE001 - a ProtocolError closed the channel; raised already
            continue


async def _abort(channel: Channel, flight: deque[asyncio.Future[Any]], handle: int) -> None:
    """Drop an unfinished write: wait for its chunks, then have the temporary file removed."""
    await _drain(flight)
    if channel.closed.done():
        return  # the kernel is gone, and its workdir with it
    try:
        await channel.call("file_write_close", {"handle": handle, "commit": False}, check=_count)
    except (RemoteError, ClosedError, ConnectionError):
        return  # the write failed already; that error is the one raised


# -- the sync twin -------------------------------------------------------------------------------


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

    def read(self, path: str) -> bytes:
        """The content of *path*; see ``KernelFiles.read``."""
        return self._portal.call(self._core.read(path))

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
