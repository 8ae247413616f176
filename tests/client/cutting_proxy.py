"""A TCP proxy on 127.0.0.1 that cuts chosen connections: for the client's stream resume."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class CuttingProxy:
    """Forwards connections to *port*; ``cut(n)`` says after how many answer bytes the *n*-th
    connection (from 0) is closed (None: never). Every request head is kept in ``heads``."""

    def __init__(self, port: int, cut: Callable[[int], int | None]) -> None:
        self._port = port
        self._cut = cut
        self._count = 0
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen; the URL to give the client."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n, self._count = self._count, self._count + 1
        limit = self._cut(n)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)

        async def upward() -> None:
            head = b""
            while data := await reader.read(65536):
                if len(self.heads) <= n:
                    head += data
                    if b"\r\n\r\n" in head:
                        self.heads.append(head.split(b"\r\n\r\n")[0])
                up_writer.write(data)
                await up_writer.drain()

        task = asyncio.get_running_loop().create_task(upward())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        sent = 0
        try:
            while data := await up_reader.read(65536):
                if limit is not None and sent + len(data) >= limit:
                    writer.write(data[: max(0, limit - sent)])
                    await writer.drain()
                    return  # cut: the client sees the connection end mid-stream
                sent += len(data)
                writer.write(data)
                await writer.drain()
        finally:
            task.cancel()
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(ConnectionError):
                    await w.wait_closed()
