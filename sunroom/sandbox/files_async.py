"""The async ``kernel.files``: :class:`KernelFiles` and :class:`SharedFile`.

What the operations do, how they are checked and how they share the kernel's lock with cells is
said in :mod:`sunroom.sandbox.files` (which also gathers the public names of the files parts).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import TYPE_CHECKING, Final, TypeVar, cast, final

from sunroom.errors import ClosedError, FileError, KernelError, ProtocolError, UsageError
from sunroom.prelude.files import MAX_GLOB
from sunroom.rpc.channel import RemoteError, cut
from sunroom.sandbox import fdtake
from sunroom.sandbox.files_checks import (
    READ_MAX_BYTES,
    FileInfo,
    ReadBudget,
    check_listing,
    check_nil,
    check_opened,
    check_path,
    check_shared,
    check_written,
)
from sunroom.sandbox.kernel_lifecycle import KernelCore

if TYPE_CHECKING:
    import asyncio

    from sunroom.rpc.channel import Channel

__all__ = ["CHUNK_BYTES", "WINDOW", "KernelFiles", "SharedFile"]

T = TypeVar("T")

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
class SharedFile:
    """A workdir file the kernel opened, taken into this process (``KernelFiles.open_shared``).

    ``fd`` reads the file (this object's: do not close it); ``size`` is the file's size when it
    was taken. The kernel is held (no cell runs) until :meth:`aclose`, which closes ``fd``.
    """

    def __init__(self, fd: int, size: int, hold: AsyncGenerator[object, None]) -> None:
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

    def __init__(self, core: KernelCore) -> None:
        self._core = core

    def _chunk_bytes(self) -> int:
        return min(CHUNK_BYTES, self._core.limits.max_frame_bytes // 2)

    async def _channel(self) -> Channel:
        await self._core.ensure()
        channel = self._core.channel
        assert channel is not None
        return channel

    async def _failed(self, what: str, exc: BaseException) -> BaseException:
        """The error to raise for *exc*, a failure of the kernel's answer to *what*.

        A kernel that broke the protocol (*exc* a ProtocolError, or the channel closed by one)
        is torn down at once, not left running until the next use starts a fresh one, and
        that ProtocolError is the error.
        """
        if isinstance(exc, RemoteError):
            reason = _REASONS.get(exc.error.type, "failed")
            return FileError(cut(exc.error.message, 200), reason=reason)
        channel = self._core.channel
        if isinstance(exc, ClosedError | ConnectionError) and channel is not None:
            exc = channel.close_reason or exc
        if isinstance(exc, ProtocolError):
            await self._core.teardown()
            return exc
        if isinstance(exc, ClosedError | ConnectionError):
            return await self._core.died(what, exc)
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
        async with self._core.lock:  # serialised with cells
            channel = await self._channel()
            try:
                opened = await channel.call("file_write_open", {"path": rel}, check=check_opened)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.write", exc) from None
            handle = opened["handle"]
            flight: deque[asyncio.Future[int]] = deque()
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
                return await channel.call("file_write_close", params, check=check_written)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.write", exc) from None
            finally:
                if not committed:
                    await _abort(channel, flight, handle)

    async def _send(
        self,
        channel: Channel,
        flight: deque[asyncio.Future[int]],
        handle: int,
        chunk: list[memoryview],
    ) -> None:
        """Send one chunk (its parts written as they are: they may change once this returns)."""
        if len(flight) >= WINDOW:
            await flight.popleft()
        params = {"handle": handle, "data": b""}  # the data: the parts, as one binary
        flight.append(channel.request("file_write_chunk", params, check=check_written, tail=chunk))

    async def read(self, path: str, *, max_bytes: int = READ_MAX_BYTES) -> bytes:
        """The whole content of the workdir file *path* (see :meth:`read_stream` for big files).

        At most *max_bytes* (default :data:`READ_MAX_BYTES`, 1 GiB): a file whose size at open
        is over it raises FileError(reason="too_big") before any of it is read. The chunks are
        kept as they arrive (what is held grows with the bytes received, never with the size
        the kernel claims), never past the size at open (the kernel sending more is a
        ProtocolError), then joined once; a file that shrank meanwhile gives what was left.
        So the host holds at most twice the bytes received, for a moment, whatever the kernel
        sends, and never more than twice *max_bytes*: no growing buffer is copied again and
        again (that measured 1.05x alone but 2.7x late in a long process).
        """
        if type(max_bytes) is not int or max_bytes < 0:
            raise UsageError("max_bytes must be an int >= 0")
        size, stream = await self.read_sized(path)
        try:
            if size > max_bytes:
                raise FileError(
                    f"{path} is {size} bytes, over the read limit of {max_bytes} bytes "
                    "(max_bytes; read_stream reads it in chunks)",
                    reason="too_big",
                )
            chunks = [chunk async for chunk in stream]  # within size: never past it
            return b"".join(chunks)  # the one copy; the chunks are dropped right after
        finally:
            await stream.aclose()

    async def read_stream(self, path: str) -> AsyncGenerator[bytes, None]:
        """The content of the workdir file *path*, chunk by chunk (at most 1 MiB each).

        It ends at the end of the file or at the file's size when it was opened, whichever
        comes first (a file that grew meanwhile is cut there, one that shrank is short). A
        kernel that sends more than that size broke the protocol: ProtocolError (the channel
        closes; the kernel starts afresh on next use), and nothing past the size is yielded.
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
        or is closed, so close it (``aclose``). It yields at most that size (a file that grew
        meanwhile is cut there; one that shrank is short; more from the kernel is a
        ProtocolError). A missing file raises here.
        """
        stream = self._reader(path)
        size = await anext(stream)
        return cast(int, size), cast(AsyncGenerator[bytes, None], stream)

    async def _reader(self, path: str) -> AsyncGenerator[int | bytes, None]:
        """The file's size when opened, then its chunks (the steps of :meth:`read_stream`).

        Never more than that size: every answer goes through a :class:`ReadBudget` of it (a
        byte more is a ProtocolError), and no request asks past it but for one byte at a time
        once it is reached, to hear the end of the file.
        """
        rel = check_path(path)
        most = self._chunk_bytes()
        async with self._core.lock:  # serialised with cells
            channel = await self._channel()
            try:
                opened = await channel.call("file_read_open", {"path": rel}, check=check_opened)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.read", exc) from None
            handle, size = opened["handle"], opened["size"]
            budget = ReadBudget(size)
            flight: deque[tuple[int, asyncio.Future[bytes]]] = deque()
            asked = 0  # bytes asked for: received, or in requests still due
            ended = False
            try:
                yield size
                while True:
                    try:
                        while not ended and len(flight) < WINDOW:
                            want = min(most, max(1, size - asked))
                            params = {"handle": handle, "size": want}
                            check = budget.check(want)
                            due = channel.request("file_read_chunk", params, check=check)
                            flight.append((want, due))
                            asked += want
                        if not flight:
                            break
                        want, due = flight.popleft()
                        chunk = await due
                    except (RemoteError, ClosedError, ConnectionError, ProtocolError) as exc:
                        raise await self._failed("files.read", exc) from None
                    asked -= want - len(chunk)  # a short answer: its rest is asked again
                    if not chunk:
                        ended = True
                        continue
                    yield chunk
            finally:
                await _drain(deque(due for _, due in flight))
                if not channel.closed.done():
                    try:
                        await channel.call("file_read_close", {"handle": handle}, check=check_nil)
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
        async with self._core.lock:  # serialised with cells
            channel = await self._channel()
            proc = self._core.proc
            pid = proc.host_pid if proc is not None else None
            if pid is None:
                yield None
                return
            try:
                params = {"path": rel, "share": True}
                opened = await channel.call("file_read_open", params, check=check_shared)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.read", exc) from None
            try:
                try:
                    fd = fdtake.take(pid, opened["fd"], dev=opened["dev"], ino=opened["ino"])
                except OSError:  # no ptrace access to this runtime: the caller reads instead
                    yield None
                    return
                except ProtocolError as exc:  # not the file it said, or a kernel interface
                    raise await self._failed("files.open_shared", exc) from None
                try:
                    yield fd, os.fstat(fd).st_size
                finally:
                    os.close(fd)
            finally:
                if not channel.closed.done():
                    params = {"handle": opened["handle"]}
                    try:
                        await channel.call("file_read_close", params, check=check_nil)
                    except RemoteError as exc:
                        raise await self._failed("files.read", exc) from None

    async def list(self, glob: str = "**/*") -> list[FileInfo]:
        """Entries of the workdir whose relative path matches *glob*, sorted by path.

        ``**`` spans directories, ``*`` and ``?`` do not. Links are listed as themselves
        (never followed); more than 10,000 matches is a FileError(reason="too_many").
        """
        if not isinstance(glob, str) or len(glob) > MAX_GLOB or "\x00" in glob:
            raise UsageError(f"glob must be a str of at most {MAX_GLOB} characters without NUL")
        async with self._core.lock:
            channel = await self._channel()
            try:
                return await channel.call("file_list", {"glob": glob}, check=check_listing)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.list", exc) from None

    async def delete(self, path: str) -> None:
        """Remove the file, link (never its target) or directory tree at *path*."""
        rel = check_path(path)
        async with self._core.lock:
            channel = await self._channel()
            try:
                await channel.call("file_delete", {"path": rel}, check=check_nil)
            except (RemoteError, ClosedError, ConnectionError) as exc:
                raise await self._failed("files.delete", exc) from None


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _drain(flight: deque[asyncio.Future[T]]) -> None:
    """Wait for the answers still due (their errors are the transfer's, raised already)."""
    while flight:
        fut = flight.popleft()
        try:
            await fut
        except (RemoteError, ClosedError, ConnectionError, KernelError):
            continue  # reported by whoever failed first, or moot: the transfer is over
        except Exception:  # noqa: BLE001 - a ProtocolError closed the channel; raised already
            continue


async def _abort(channel: Channel, flight: deque[asyncio.Future[int]], handle: int) -> None:
    """Drop an unfinished write: wait for its chunks, then have the temporary file removed."""
    await _drain(flight)
    if channel.closed.done():
        return  # the kernel is gone, and its workdir with it
    try:
        await channel.call(
            "file_write_close", {"handle": handle, "commit": False}, check=check_written
        )
    except (RemoteError, ClosedError, ConnectionError):
        return  # the write failed already; that error is the one raised
