"""``sunroom mcp``: kernels served to MCP clients, one persistent kernel per MCP session.

Over stdio by default (nothing but protocol frames on stdout), or streamable HTTP at ``/mcp``
with a bearer token (``--http``). The server itself is :mod:`sunroom.service.mcp.server`; this
is its command line, which fails with one line on stderr (exit 2) for a bad option or a missing MCP
SDK. Started in a terminal (stdin a tty) it says on stderr that it waits for an MCP client; with
stdin a pipe, as a client starts it, stderr stays silent. See docs/mcp.md.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

from sunroom.cli.options import chosen_backend, model_spec
from sunroom.cli.support import KernelNameOption, SandboxOption, fail, guarded, one_line
from sunroom.errors import SunroomError
from sunroom.sandbox.backends import DEFAULT_BACKEND, NAMES
from sunroom.sandbox.limits import Limits

__all__ = ["mcp"]


def mcp(
    http: Annotated[bool, typer.Option("--http", help="Streamable HTTP instead of stdio.")] = False,
    host: Annotated[str, typer.Option(help="Address to listen on (--http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (--http; 0: any free port).")] = 8766,
    expose: Annotated[
        bool, typer.Option("--expose", help="Allow listening on a non-loopback address.")
    ] = False,
    backend: Annotated[
        str | None, typer.Option(help=f"Kernel backend: {', '.join(NAMES)} (or SUNROOM_BACKEND).")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Default seconds a cell may run.")] = 30.0,
    max_timeout: Annotated[float, typer.Option(help="Largest timeout_s a call may ask.")] = 600.0,
    memory_mb: Annotated[int, typer.Option(help="Memory limit of a kernel in MB.")] = 2048,
    max_file_bytes: Annotated[
        int, typer.Option(help="Largest file read_file returns and write_file writes.")
    ] = 8 * 1024 * 1024,
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="A model run_agent may use (repeatable; the first is the default; "
            "or SUNROOM_MODEL). None: no run_agent tool."
        ),
    ] = None,  # fmt: skip
    base_url: Annotated[
        str | None, typer.Option(help="Model endpoint (or SUNROOM_BASE_URL).")
    ] = None,
    max_turns: Annotated[int, typer.Option(help="Model turns of one run_agent.")] = 20,
    max_sessions: Annotated[int, typer.Option(help="Open MCP sessions at once (--http).")] = 16,
    session_idle: Annotated[
        float, typer.Option(help="Seconds before an idle session (and its kernel) ends (--http).")
    ] = 1800.0,
    kernel_name: KernelNameOption = None,
    sandbox: SandboxOption = None,
) -> None:
    """Serve kernels to MCP clients: one persistent kernel per MCP session (docs/mcp.md).

    stdio by default (nothing but protocol frames on stdout): an MCP client starts this command
    and talks to it on stdin/stdout (docs/mcp.md says how to configure one). --http serves
    streamable HTTP at /mcp with a bearer token (SUNROOM_TOKEN, or generated and printed).
    """
    try:
        from sunroom.service.mcp import server as mcp_server
    except ImportError as exc:
        raise fail(f"sunroom mcp needs the MCP SDK: pip install 'sunroom[mcp]' ({exc})") from None

    models = model or ([os.environ["SUNROOM_MODEL"]] if os.environ.get("SUNROOM_MODEL") else [])
    chosen = chosen_backend(
        backend or os.environ.get("SUNROOM_BACKEND") or DEFAULT_BACKEND, kernel_name, sandbox
    )
    try:
        settings = mcp_server.McpSettings(
            backend=chosen,
            limits=Limits(timeout_s=timeout, memory_mb=memory_mb), max_timeout_s=max_timeout,
            max_file_bytes=max_file_bytes, models=tuple(model_spec(m) or m for m in models),
            base_url=base_url or os.environ.get("SUNROOM_BASE_URL"), max_turns=max_turns,
            max_sessions=max_sessions, session_idle_s=session_idle,
        )  # fmt: skip
        config = None
        if http:
            from sunroom.service import ServiceConfig

            config = ServiceConfig.from_env(host=host, port=port, expose=expose or None)
    except SunroomError as exc:
        raise fail(str(exc)) from None
    guarded(lambda: mcp_server.check(settings))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if config is None:
        if sys.stdin.isatty():  # a person, not a client: say what this is, on stderr
            sys.stderr.write(
                "sunroom mcp: waiting for an MCP client on stdin (an MCP client starts this "
                'command itself: see "Client configuration" in docs/mcp.md, or use --http); '
                "Ctrl-C stops\n"
            )
        guarded(lambda: mcp_server.serve_stdio(settings))
        return
    from sunroom.service import bind

    try:
        sock = bind(config)
    except OSError as exc:
        raise fail(f"cannot listen on {config.host}:{config.port}: {one_line(exc)}") from None
    token = config.with_token().token
    shown = f"[{config.host}]" if ":" in config.host else config.host
    typer.echo(f"sunroom mcp listening on http://{shown}:{sock.getsockname()[1]}/mcp")
    typer.echo("token: from SUNROOM_TOKEN" if config.token else f"token: {token}")
    sys.stdout.flush()
    guarded(
        lambda: mcp_server.serve_http(
            settings, sock=sock, token=token, host_allowed=config.host_allowed
        )
    )
