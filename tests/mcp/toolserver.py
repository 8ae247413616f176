"""An MCP server for the tests, written with the official SDK: ``python toolserver.py stdio``
or ``python toolserver.py http PORT`` (streamable HTTP on 127.0.0.1) or ``... sse PORT``.

Its tools cover what binding must handle: optional and defaulted arguments, enums, nested
objects, arrays, structured output, errors, a crash, a hang, a flood, an image and a tool list
that changes. ``--extra N`` adds N more simple tools (the 50-tool benchmark). The environment
variable ``TOOLSERVER_TOKEN``, when set, is a credential the server holds and never returns.
"""

from __future__ import annotations

import asyncio
import enum
import os
import struct
import sys
import zlib
from typing import Literal

import pydantic
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("toolserver", instructions="Issue tracker tools for the sunroom tests.")


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Author(pydantic.BaseModel):
    name: str
    email: str | None = None


class NewIssue(pydantic.BaseModel):
    title: str
    body: str = ""
    author: Author
    tags: list[str] = []


class Issue(pydantic.BaseModel):
    number: int
    title: str
    priority: Priority
    author: Author
    tags: list[str]


@server.tool()
def search_issues(
    query: str,
    limit: int = 5,
    state: Literal["open", "closed"] = "open",
    labels: list[str] | None = None,
) -> str:
    """Search issues by text.

    Returns one line per match.
    """
    found = [f"#{i} {query} ({state})" for i in range(1, limit + 1)]
    if labels:
        found = [f"{line} [{','.join(labels)}]" for line in found]
    return "\n".join(found)


@server.tool()
def create_issue(issue: NewIssue, priority: Priority = Priority.LOW) -> Issue:
    """Create an issue; returns it with its number."""
    return Issue(
        number=7, title=issue.title, priority=priority, author=issue.author, tags=issue.tags
    )


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def fail(message: str) -> str:
    """Always fails with *message*."""
    raise ValueError(message)


@server.tool()
def crash() -> str:
    """Kill this server process mid-call."""
    os._exit(3)


@server.tool()
async def hang(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "woke"


@server.tool()
def flood(n_bytes: int) -> str:
    """A result of *n_bytes* characters."""
    return "x" * n_bytes


@server.tool()
def shout(n_bytes: int, last: str = "done shouting") -> str:
    """Write *n_bytes* to stderr, then *last* on a line of its own."""
    chunk = "e" * 65536
    for _ in range(n_bytes // len(chunk)):
        sys.stderr.write(chunk)
    sys.stderr.write("\n" + last + "\n")
    sys.stderr.flush()
    if last.startswith("die"):
        os._exit(4)
    return "ok"


def _png(width: int, height: int) -> bytes:
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", head)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


@server.tool()
def red_square(size: int = 4) -> Image:
    """A red PNG square."""
    return Image(data=_png(size, size), format="png")


@server.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


@server.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool named *name* (it returns its own name) and tell the client the list changed."""
    server.add_tool(lambda: name, name=name, description=f"Added at run time: {name}.")
    await ctx.notify_tools_changed()
    session = getattr(ctx.request_context, "session", None)
    sender = getattr(session, "send_tool_list_changed", None)
    if sender is not None:
        await sender()
    return "added"


def _extra(n: int) -> None:
    for i in range(n):

        def tool(x: int, label: str = "") -> str:
            return f"{label}{x}"

        server.add_tool(tool, name=f"extra_{i}", description=f"Extra tool number {i}.")


def main() -> None:
    args = sys.argv[1:]
    if "--extra" in args:
        at = args.index("--extra")
        _extra(int(args[at + 1]))
        del args[at : at + 2]
    mode = args[0] if args else "stdio"
    if mode == "stdio":
        server.run("stdio")
    elif mode in ("http", "sse"):
        port = int(args[1])
        if mode == "http":
            server.run("streamable-http", host="127.0.0.1", port=port)
        else:
            server.run("sse", host="127.0.0.1", port=port)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
