"""sunroom as an MCP server: ``sunroom mcp`` (stdio) and ``sunroom mcp --http`` (streamable HTTP).

Built on the official ``mcp`` SDK's low-level :class:`mcp.server.lowlevel.Server`. The tools:

- ``execute_code(code, timeout_s)`` runs a cell in the MCP session's own persistent kernel:
  stdout, stderr, the trailing value and the error come back as text, display outputs
  (figures, ``display()``) as image content, the whole result as structured content. Code that
  raises or times out is a normal result with ``isError`` true, never a protocol error. Output
  is capped as the kernel caps it (``Limits.max_output_bytes`` per stream, head and tail kept;
  ``Limits.display_bytes`` of display items per cell).
- ``reset_kernel()`` closes the session's kernel; the next call starts a fresh one.
- ``list_files(glob)``, ``read_file(path)``, ``write_file(path, content, encoding)``: the
  kernel's workdir through ``kernel.files`` (paths relative to it; absolute paths, ``..`` and
  links out of it are refused). ``read_file`` answers text content when the file is UTF-8,
  else an embedded blob resource (base64); files over :attr:`McpSettings.max_file_bytes` are
  refused, as are writes over it.
- ``run_agent(task, model, preset)``, only when a model is configured: a fresh agent session
  (``sunroom.agent``) with the same backend and limits, its answer as the result.

Sessions: over HTTP every MCP session (``Mcp-Session-Id``, the initialize handshake) has its
own kernel, started at its first use and closed when the session ends (DELETE, idle timeout,
server stop). Over stdio the process serves one client: one kernel, closed at EOF. The
2026-07-28 stateless protocol has no session to keep a kernel in, so over HTTP the server
advertises only the handshake versions in ``server/discover`` (clients fall back to the
handshake) and refuses tool calls that arrive stateless.

Errors: a tool whose work fails (a refused path, a kernel that cannot start, invalid
arguments) answers ``isError`` with one sentence; an unknown tool or a stateless call is a
protocol error.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, Literal

import mcp_types as types
import pydantic
import uvicorn
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sunroom.errors import SunroomError, UsageError
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.service.mcp.served_tools import failure, server_tools
from sunroom.service.mcp.session_kernels import MAX_TIMEOUT_S, McpSettings, SessionKernels
from sunroom.service.problems import error_body, validation_message
from sunroom.service.server import QuietExitServer

__all__ = [
    "MAX_TIMEOUT_S",
    "McpSettings",
    "SessionKernels",
    "build_server",
    "check",
    "serve_http",
    "serve_stdio",
]

_MIN_BODY_BYTES: Final = 4 * 1024 * 1024
"""The HTTP request body cap, raised to fit a ``write_file`` of ``max_file_bytes`` (base64)."""

Transport = Literal["stdio", "http"]


# -- the server ---------------------------------------------------------------------------------


def _connection(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The connection (the MCP session) a request came on.

    The SDK (2.3) hands low-level handlers a per-request ``ServerSession`` that holds the
    connection privately; there is no public way to it yet.
    """
    connection = getattr(ctx.session, "_connection", None)
    if not isinstance(connection, Connection):
        raise UsageError("this version of the mcp SDK does not expose the session's connection")
    return connection


def build_server(settings: McpSettings, *, transport: Transport) -> Server[SessionKernels]:
    """The MCP server of *settings* for *transport* (``stdio``: one client; ``http``: many)."""
    tools = server_tools(settings)

    @asynccontextmanager
    async def lifespan(_: Server[SessionKernels]) -> AsyncIterator[SessionKernels]:
        kernels = SessionKernels(settings)
        try:
            yield kernels
        finally:
            await kernels.aclose()

    async def list_tools(
        ctx: ServerRequestContext[SessionKernels, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.tool for t in tools.values()])

    async def call_tool(
        ctx: ServerRequestContext[SessionKernels, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        entry = tools.get(params.name)
        if entry is None:
            raise MCPError(types.INVALID_PARAMS, f"there is no tool named {params.name!r}")
        if transport == "stdio":
            slot = ctx.lifespan_context.slot(None)
        elif ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(
                types.INVALID_REQUEST,
                "sunroom keeps a kernel per MCP session: connect with the initialize handshake "
                f"(protocol {HANDSHAKE_PROTOCOL_VERSIONS[-1]}), not a stateless request",
            )
        else:
            slot = ctx.lifespan_context.slot(_connection(ctx))
        try:
            args = entry.args.model_validate(params.arguments or {})
        except pydantic.ValidationError as exc:
            return failure(f"invalid arguments: {validation_message(exc)}")
        try:
            return await entry.run(ctx.lifespan_context, slot, args)
        except SunroomError as exc:
            return failure(str(exc))

    from sunroom import __version__

    server: Server[SessionKernels] = Server(
        "sunroom",
        version=__version__,
        title="sunroom",
        instructions="Run Python in a persistent, sandboxed kernel of this session "
        "(execute_code); move files in and out of its workdir.",
        lifespan=lifespan,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    if transport == "http":

        async def discover(
            ctx: ServerRequestContext[SessionKernels, Any], params: types.RequestParams
        ) -> types.DiscoverResult:
            # only the handshake versions: the stateless era has no session for a kernel
            return types.DiscoverResult(
                supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
                capabilities=server.get_capabilities(),
                instructions=server.instructions,
            )

        server.add_request_handler("server/discover", types.RequestParams, discover)
    return server


async def check(settings: McpSettings) -> None:
    """Fail before serving when the backend or a model cannot work.

    Starts and closes one kernel, and builds (then closes) every model. Raises
    SandboxUnavailableError (saying what to install), KernelStartError, UsageError (an
    unknown provider) and AuthenticationError (no API key).
    """
    from sunroom.service.models import resolve_model

    for spec in settings.models:
        await resolve_model(spec, settings.base_url).aclose()
    async with AsyncKernel(backend=settings.backend, limits=settings.limits):
        pass


async def serve_stdio(settings: McpSettings) -> None:
    """Serve one client over this process's stdin and stdout until EOF.

    While serving, the SDK points fd 1 at stderr: nothing but protocol frames reaches stdout.
    """
    server = build_server(settings, transport="stdio")
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def _http_problem(request: Request, exc: Exception) -> Response:
    """Starlette's HTTP errors (an unknown path: 404) in the service's JSON error shape.

    The type is ``HTTPException``, as ``sunroom serve`` answers them; the message never echoes
    the path.
    """
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = "there is no such path on this server; MCP is served at /mcp"
    else:
        message = str(exc.detail)
    body = error_body("HTTPException", message)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def serve_http(
    settings: McpSettings,
    *,
    sock: socket.socket,
    token: str,
    host_allowed: Callable[[str], bool],
) -> None:
    """Serve streamable HTTP at ``/mcp`` on the listening *sock* until SIGINT/SIGTERM.

    Every request needs ``Authorization: Bearer <token>`` (401 otherwise) and a ``Host`` that
    *host_allowed* accepts (400 otherwise). Any other path is a 404 in the service's JSON error
    shape (``{"error": {"type", "message"}}``), never plain text. At most
    ``settings.max_sessions`` MCP sessions are open at once (503 beyond); one idle for
    ``settings.session_idle_s`` is ended, and its kernel closed.
    """
    from sunroom.service.auth import BearerAuth, HostCheck

    server = build_server(settings, transport="http")
    host = sock.getsockname()[0]
    app = server.streamable_http_app(
        host=host,
        max_sessions=settings.max_sessions,
        session_idle_timeout=settings.session_idle_s,
        max_request_body_size=max(_MIN_BODY_BYTES, settings.max_file_bytes * 4 // 3 + (1 << 16)),
    )
    app.add_exception_handler(HTTPException, _http_problem)
    guarded = HostCheck(BearerAuth(app, token=token, open_paths=()), allowed=host_allowed)
    config = uvicorn.Config(
        guarded,
        log_level="warning",
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    await QuietExitServer(config).serve(sockets=[sock])
