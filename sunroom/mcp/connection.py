"""One live connection to one MCP server, made with the official SDK: :class:`Connection`.

The SDK's client is an async context manager whose enter and exit must happen in one task, so
each connection runs in a task of its own that enters it, reports ready, and holds it open until
:meth:`Connection.aclose`. Calls are made from any task of the same event loop.

A server that exits (a crash, a killed process, a dropped HTTP session) fails the calls in
flight with :class:`~sunroom.errors.McpServerError`; the next call starts it again (a restart
is counted in :attr:`Connection.restarts`). The stdio server's stderr goes to a file of its own;
its last lines are quoted in error messages with the server's credentials masked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TextIO, final

import httpx2
from mcp import Client
from mcp import types as mcp_types
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from sunroom.errors import HostFunctionError, McpServerError
from sunroom.mcp.servers import HttpServer, McpServer, StdioServer
from sunroom.mcp.stdio_transport import TOO_LARGE, stdio_transport
from sunroom.rpc.settle import settle

__all__ = ["Connection"]

_log = logging.getLogger(__name__)

MAX_TOOLS: Final = 1000
"""Tools bound from one server; a longer list is refused (it would not fit a prompt anyway)."""
_MAX_PAGES: Final = 100
_STDERR_TAIL: Final = 300


def message_cap(server: McpServer) -> int:
    """The largest message read from a stdio server.

    Room for a result of ``max_result_bytes`` as text content and as structured content,
    JSON-escaped.
    """
    return 3 * server.max_result_bytes + (64 << 10)


class Connection:
    """A connection to *server*; :meth:`tools` connects, :meth:`call` calls a tool.

    *on_tools_changed* is called (on the loop) when the server says its tool list changed.
    """

    def __init__(
        self, server: McpServer, *, on_tools_changed: Callable[[], None] | None = None
    ) -> None:
        self.server = server
        self.restarts = 0
        self._on_tools_changed = on_tools_changed
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._errlog: _StderrTail | None = None
        self._connected_once = False

    # -- lifecycle -------------------------------------------------------------------------

    async def connect(self) -> None:
        """Start (or reach) the server and complete the MCP handshake, if not done yet."""
        await self._connect()

    async def _connect(self) -> Client:
        """The live client, connecting (or reconnecting after an exit) first if needed."""
        if self._closed:
            raise McpServerError(f"the MCP server {self.server.name!r} is closed")
        async with self._lock:
            if self._client is not None and self._task is not None and not self._task.done():
                return self._client
            await self._drop()
            if self._connected_once:
                self.restarts += 1
            loop = asyncio.get_running_loop()
            ready: asyncio.Future[Client] = loop.create_future()
            self._stop = asyncio.Event()
            self._task = loop.create_task(
                self._hold(ready, self._stop), name=f"sunroom-mcp-{self.server.name}"
            )
            try:
                client = await asyncio.wait_for(
                    asyncio.shield(ready), self.server.connect_timeout_s
                )
            except TimeoutError:
                await self._drop()
                raise McpServerError(
                    f"the MCP server {self.server.name!r} did not answer within "
                    f"{self.server.connect_timeout_s:g} s of starting{self._stderr_tail()}"
                ) from None
            except McpServerError:
                await self._drop()
                raise
            self._client = client
            self._connected_once = True
            return client

    async def _hold(self, ready: asyncio.Future[Client], stop: asyncio.Event) -> None:
        """Enter the SDK client, hand it over, keep it open until *stop* (one task: anyio)."""
        try:
            async with Client(
                self._transport(), message_handler=self._on_message, mode="legacy"
            ) as client:
                if not ready.done():
                    ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # noqa: BLE001 - the connection's end is data here
            if not ready.done():
                ready.set_exception(
                    McpServerError(
                        f"the MCP server {self.server.name!r} could not be started: "
                        f"{self._describe(exc)}{self._stderr_tail()}"
                    )
                )
            elif not stop.is_set():
                _log.info("MCP server %r connection ended: %s", self.server.name, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self._task is asyncio.current_task():
                self._client = None

    def _transport(self) -> Any:
        server = self.server
        if isinstance(server, StdioServer):
            if self._errlog is None:
                self._errlog = _StderrTail()
            return stdio_transport(
                server, stderr=self._errlog.writer, max_message_bytes=message_cap(server)
            )
        assert isinstance(server, HttpServer)
        if server.transport == "sse":
            return sse_client(server.url, headers=dict(server.headers))
        return _streamable(server)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            if self._on_tools_changed is not None:
                self._on_tools_changed()
        elif isinstance(message, Exception):
            _log.debug("MCP server %r: %s", self.server.name, message)

    async def _drop(self) -> None:
        """End the current connection task, if any (the server process is stopped with it)."""
        task, stop = self._task, self._stop
        self._task = self._stop = None
        self._client = None
        if task is None:
            return
        if stop is not None:
            stop.set()
        try:  # how the old connection ended is not news; a cancel of the caller's task is
            ended = await asyncio.wait_for(settle(asyncio.shield(task)), 5.0)
        except TimeoutError:
            task.cancel()
            await settle(task)
            return
        except asyncio.CancelledError:
            task.cancel()  # nobody is left to wait for it
            raise
        if ended is not None:
            _log.debug("MCP server %r closed with %r", self.server.name, ended)

    async def aclose(self) -> None:
        """Close the connection and stop a stdio server (idempotent)."""
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            await self._drop()
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    # -- calls -----------------------------------------------------------------------------

    async def tools(self) -> list[mcp_types.Tool]:
        """The server's tools (all pages), connecting first if needed."""
        client = await self._connect()
        out: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            async with asyncio.timeout(self.server.connect_timeout_s):
                for _ in range(_MAX_PAGES):
                    page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                    out.extend(page.tools)
                    cursor = page.next_cursor
                    if cursor is None or len(out) > MAX_TOOLS:
                        break
        except TimeoutError:
            raise McpServerError(
                f"the MCP server {self.server.name!r} did not list its tools within "
                f"{self.server.connect_timeout_s:g} s"
            ) from None
        except MCPError as exc:
            raise McpServerError(
                f"the MCP server {self.server.name!r} failed to list its tools: "
                f"{self._describe(exc)}"
            ) from None
        if len(out) > MAX_TOOLS:
            raise McpServerError(
                f"the MCP server {self.server.name!r} lists more than {MAX_TOOLS} tools"
            )
        return out

    async def call(self, tool: str, arguments: dict[str, object]) -> mcp_types.CallToolResult:
        """Call *tool*; a server that is gone (or goes during the call) is McpServerError."""
        client = await self._connect()
        mark = self._stderr_size()
        try:
            return await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == TOO_LARGE:
                raise HostFunctionError(
                    f"the MCP server {self.server.name!r} answered {tool}() with more than "
                    f"{message_cap(self.server):,} bytes, over the message cap (3x its "
                    f"max_result_bytes of {self.server.max_result_bytes:,}); the answer was "
                    "dropped unread"
                ) from None
            if exc.code == CONNECTION_CLOSED or self._task is None or self._task.done():
                async with self._lock:
                    await self._drop()
                raise McpServerError(
                    f"the MCP server {self.server.name!r} exited during the call to {tool}() "
                    f"({self._describe(exc)}); it is started again at the next call"
                    f"{self._stderr_tail(since=mark)}"
                ) from None
            raise McpServerError(
                f"the MCP server {self.server.name!r} refused the call to {tool}(): "
                f"{self._describe(exc)}"
            ) from None
        except (OSError, httpx2.HTTPError) as exc:
            async with self._lock:
                await self._drop()
            raise McpServerError(
                f"the MCP server {self.server.name!r} could not be reached for {tool}(): "
                f"{self._describe(exc)}"
            ) from None

    # -- messages --------------------------------------------------------------------------

    def _mask(self, text: str) -> str:
        for secret in self.server.secrets():
            text = text.replace(secret, "***")
        return text

    def _describe(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        text = str(exc) or type(exc).__name__
        return self._mask(text[:300])

    def _stderr_size(self) -> int:
        return 0 if self._errlog is None else self._errlog.written()

    def _stderr_tail(self, since: int = 0) -> str:
        """The server's last stderr line written after byte *since*, masked, or ""."""
        line = "" if self._errlog is None else self._errlog.last_line(since)
        if not line:
            return ""
        return f"; its last stderr line: {self._mask(line)[-_STDERR_TAIL:]}"


@final
class _StderrTail:
    """A stdio server's stderr, through a pipe: the last 4 KiB kept, the rest counted, dropped.

    A server that floods stderr costs nothing but the reading; error messages quote its last
    line. The pipe is read on the event loop (``add_reader``).
    """

    KEEP: Final = 4096

    def __init__(self) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        self._fd = read
        self.writer: TextIO = os.fdopen(write, "w", encoding="utf-8", errors="replace")
        self._tail = bytearray()
        self._total = 0
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(read, self._read)

    def _read(self) -> bool:
        """Take what the pipe holds now; whether anything came."""
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self._fd)
            return False
        self._total += len(data)
        self._tail += data
        del self._tail[: -self.KEEP]
        return True

    def written(self) -> int:
        """Bytes the server has written to stderr so far (drained first)."""
        while self._fd >= 0 and self._read():
            pass
        return self._total

    def last_line(self, since: int) -> str:
        """The last non-empty line among the bytes written after *since* (kept ones only)."""
        total = self.written()
        fresh = (
            bytes(self._tail[-min(len(self._tail), max(0, total - since)) :])
            if total > since
            else b""
        )
        lines = [ln.strip() for ln in fresh.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def close(self) -> None:
        """Stop reading and close both ends."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self.writer.close()


@contextlib.asynccontextmanager
async def _streamable(server: HttpServer) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport on an HTTP client of ours (closed with it)."""
    timeout = httpx2.Timeout(server.connect_timeout_s, read=None)
    async with (
        httpx2.AsyncClient(headers=dict(server.headers), timeout=timeout) as http,
        streamable_http_client(server.url, http_client=http) as streams,
    ):
        yield streams
