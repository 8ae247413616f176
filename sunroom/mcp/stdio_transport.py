"""The stdio transport to an MCP server, with a cap on one message: :func:`stdio_transport`.

It replaces the SDK's ``stdio_client`` for one reason: a message's size. The SDK joins a long
line chunk by chunk (quadratic: a 50 MB result took over a minute here) and keeps all of it in
memory. This reader joins in linear time and stops keeping a line past *max_message_bytes*:
the rest of that line is read and dropped, and the call it answered fails at once with a
JSON-RPC error naming both sizes (:data:`TOO_LARGE`), its id taken from the line's head. The
connection stays usable. Everything else follows the SDK's transport: newline-delimited
JSON-RPC, the server in a process group of its own with a minimal environment, and shutdown by
closing stdin, then SIGTERM to the group, then SIGKILL, each wait bounded and shielded from
cancellation so no server process outlives its connection.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Final, TextIO

import anyio
import anyio.abc
import mcp_types as types
from mcp.client._transport import TransportStreams
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from sunroom.mcp.servers import StdioServer

__all__ = ["TOO_LARGE", "stdio_transport"]

_log = logging.getLogger(__name__)

TOO_LARGE: Final = -32090
"""The JSON-RPC error code of a call whose answer was over the message cap."""

_HEAD: Final = 4096
_ID: Final = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')
_EXIT_S: Final = 2.0
_POLL_S: Final = 0.02


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        _log.warning("an MCP server sent a line that is not JSON-RPC: %s", exc)
        return exc


def _too_large(head: bytes, size: int, cap: int) -> SessionMessage | Exception:
    """The error answer to the call whose answer (of *size* bytes) started with *head*."""
    found = _ID.search(head)
    message = f"the server's answer of {size:,} bytes is over the {cap:,}-byte message cap"
    if found is None:
        return ValueError(f"{message}; its request id was not in its first {_HEAD} bytes")
    body = {
        "jsonrpc": "2.0",
        "id": json.loads(found.group(1)),
        "error": {"code": TOO_LARGE, "message": message, "data": {"size": size, "cap": cap}},
    }
    return _parse(json.dumps(body).encode())


async def _wait_exit(process: anyio.abc.Process, within_s: float) -> bool:
    """Whether *process* exited within *within_s*.

    Polled, not ``process.wait()``: that also waits for its pipes to close, which a child of the
    server still holding them would delay.
    """
    with anyio.move_on_after(within_s):
        while process.returncode is None:  # noqa: ASYNC110 - nothing to wait on but the poll
            await anyio.sleep(_POLL_S)
    return process.returncode is not None


def _signal_group(process: anyio.abc.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


@contextlib.asynccontextmanager
async def stdio_transport(
    server: StdioServer, *, stderr: TextIO, max_message_bytes: int
) -> AsyncIterator[TransportStreams]:
    """Start *server* and yield the SDK's (read, write) streams to it; stop it on exit."""
    process = await anyio.open_process(
        [server.command, *server.args],
        env=get_default_environment() | dict(server.env),
        stderr=stderr,
        cwd=server.cwd,
        start_new_session=True,
    )
    to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        assert process.stdout is not None
        lines = _Lines(max_message_bytes)
        async with to_session:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                async for chunk in process.stdout:
                    for message in lines.feed(chunk):
                        await to_session.send(message)

    async def write() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the session sees the end instead of a hang

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield from_server, to_server
        finally:
            with anyio.CancelScope(shield=True):
                to_server.close()
                from_server.close()
                await _stop(process, server.name)
            tasks.cancel_scope.cancel()


class _Lines:
    """Splits a server's output into messages, one a line; a line over the cap is refused.

    A line longer than *max_message_bytes* is not kept: its bytes are counted and it becomes
    the error :func:`_too_large` makes (quoting its first bytes); blank lines are skipped.
    """

    def __init__(self, max_message_bytes: int) -> None:
        self.cap = max_message_bytes
        self.line = bytearray()
        self.dropped = 0  # > 0: the current line is over the cap; bytes seen so far
        self.head = b""

    def feed(self, chunk: bytes) -> Iterator[SessionMessage | Exception]:
        """The messages *chunk* completes, in order (a generator: parsed as they are sent)."""
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            self._take(chunk[start:] if end < 0 else chunk[start:end])
            if end < 0:
                return
            if self.dropped:
                yield _too_large(self.head, self.dropped, self.cap)
                self.dropped = 0
            elif self.line.strip():
                yield _parse(bytes(self.line))
            self.line.clear()
            start = end + 1

    def _take(self, piece: bytes) -> None:
        if self.dropped:
            self.dropped += len(piece)
        elif len(self.line) + len(piece) > self.cap:
            self.head = bytes(self.line[:_HEAD]) + piece[: max(0, _HEAD - len(self.line))]
            self.dropped = len(self.line) + len(piece)
            self.line.clear()
        else:
            self.line += piece


async def _stop(process: anyio.abc.Process, name: str) -> None:
    """Close the server's stdin, then TERM and KILL its process group until it has exited."""
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        if process.stdin is not None:
            await process.stdin.aclose()
    if not await _wait_exit(process, _EXIT_S):
        _signal_group(process, signal.SIGTERM)
        if not await _wait_exit(process, _EXIT_S):
            _signal_group(process, signal.SIGKILL)
            if not await _wait_exit(process, _EXIT_S):
                _log.warning("MCP server %r (pid %d) survived SIGKILL", name, process.pid)
    _signal_group(process, signal.SIGKILL)  # what it left in its group
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        if process.stdout is not None:
            await process.stdout.aclose()
