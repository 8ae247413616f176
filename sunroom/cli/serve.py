"""``sunroom serve``: the HTTP/SSE service (raw kernels; agent sessions too when it has a model).

Everything the options can get wrong (the default backend, model and its API key, host
functions, ``--template`` and ``--mcp`` files, named networks) fails before it listens, with one
line on stderr and exit status 2. It prints where it listens, the token (from SUNROOM_TOKEN, or
generated) and the store, then serves until stopped (:func:`sunroom.service.serve`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sunroom.cli.network import named_networks
from sunroom.cli.options import mcp_servers, model_spec
from sunroom.cli.support import (
    DbOption,
    FunctionsOption,
    KernelNameOption,
    SandboxOption,
    fail,
    function_specs,
    guarded,
    importable_here,
    one_line,
)
from sunroom.errors import SunroomError
from sunroom.extras import missing, require
from sunroom.sandbox.backends.choice import OPTION_NAMES, choose_backend

if TYPE_CHECKING:
    from sunroom.service import ServiceConfig

__all__ = ["serve"]


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 8765,
    db: DbOption = None,
    expose: Annotated[
        bool, typer.Option("--expose", help="Allow listening on a non-loopback address.")
    ] = False,
    backend: Annotated[str | None, typer.Option(help="Default kernel backend.")] = None,
    kernel_name: KernelNameOption = None,
    sandbox: SandboxOption = None,
    model: Annotated[str | None, typer.Option(help="Default model of sessions.")] = None,
    base_url: Annotated[str | None, typer.Option(help="Base URL of that model.")] = None,
    functions: FunctionsOption = None,
    lease_s: Annotated[float | None, typer.Option(help="Session lease in seconds.")] = None,
    max_sessions: Annotated[
        int | None,
        typer.Option(help="Live sessions at once (idle ones are released first). [default: 64]"),
    ] = None,
    max_kernels: Annotated[
        int | None,
        typer.Option(help="Raw kernels at once (429 beyond). [default: 128]"),
    ] = None,
    session_idle_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds an idle session keeps its kernel before it is released (it resumes "
            "from its log on its next message). [default: 600]"
        ),
    ] = None,
    max_kernel_requests: Annotated[
        int | None,
        typer.Option(
            help="Kernel starts and executes in flight or queued at once (1 to 65536; "
            "429 beyond). [default: 256]"
        ),
    ] = None,
    template: Annotated[
        list[str] | None,
        typer.Option(
            help="A kernel template NAME=FILE: FILE's Python code runs once in a warm kernel "
            "that requests naming NAME fork (repeatable; docs/fork.md)."
        ),
    ] = None,
    mcp: Annotated[
        Path | None,
        typer.Option(
            "--mcp",
            help='A JSON file of MCP servers ({"mcpServers": {...}}) that requests may bind '
            'by name with "mcp": [...] (docs/mcp.md).',
        ),
    ] = None,
    network: Annotated[
        list[str] | None,
        typer.Option(
            "--network",
            help="A network policy NAME=FILE (JSON: allow, inject, ...) that requests may "
            'name with "network": NAME (repeatable; docs/network.md).',
        ),
    ] = None,
    client_network: Annotated[
        bool,
        typer.Option(
            help='Let requests send their own allowlist ("network": {"allow": [...]}; hosts '
            "only, no injected headers, no private addresses)."
        ),
    ] = False,
    advertise_url: Annotated[
        str | None,
        typer.Option(
            help="This replica's internal base URL, where other replicas of the same store "
            "forward its sessions' and kernels' requests (docs/deploy.md)."
        ),
    ] = None,
    drain_grace_s: Annotated[
        float | None,
        typer.Option(
            help="On SIGTERM, how long runs in progress may go on before they are stopped and "
            "handed to other replicas (seconds). [default: 20]"
        ),
    ] = None,
    e2b_pool: Annotated[
        int | None,
        typer.Option(
            help="Warm kernels kept started for the E2B-compatible API's next sandboxes "
            "(0 to 64; docs/integrations.md). [default: 0]"
        ),
    ] = None,
    metrics_public: Annotated[
        bool,
        typer.Option(
            help="Serve GET /metrics (Prometheus) without the bearer token (docs/observability.md)."
        ),
    ] = False,
    ui: Annotated[
        bool,
        typer.Option(
            "--ui/--no-ui",
            help="Serve the web view at / (log in with the token; docs/service.md). [default: on]",
        ),
    ] = True,
    otlp_endpoint: Annotated[
        str | None,
        typer.Option(
            "--otlp-endpoint",
            help="Send traces to this OTLP/HTTP collector (base URL, e.g. "
            "http://127.0.0.1:4318; default: OTEL_EXPORTER_OTLP_ENDPOINT, if set; "
            "docs/observability.md).",
        ),
    ] = None,
) -> None:
    """Run the HTTP/SSE service (token from SUNROOM_TOKEN, or generated and printed).

    With --backend jupyter, --kernel-name and --sandbox are the defaults of jupyter kernels and
    sessions whose request names none.
    """
    try:
        require("service", "sunroom serve")
    except SunroomError as exc:
        raise fail(str(exc)) from None
    from sunroom.service import ServiceConfig, bind
    from sunroom.service import serve as run_server

    fns = function_specs(functions)
    templates = _templates(template or [])
    try:
        base = ServiceConfig.from_env(
            host=host, port=port, db=db, expose=expose or None, backend=backend,
            kernel_name=kernel_name, sandbox=sandbox,
            model=model_spec(model or os.environ.get("SUNROOM_MODEL")), base_url=base_url,
            functions=fns, lease_s=lease_s, max_kernel_requests=max_kernel_requests,
            max_sessions=max_sessions, max_kernels=max_kernels, session_idle_s=session_idle_s,
            templates=templates or None, mcp_servers=mcp_servers(mcp),
            networks=named_networks(network or []), client_network=client_network or None,
            e2b_pool=e2b_pool, metrics_public=metrics_public or None, ui=None if ui else False,
            advertise_url=advertise_url, drain_grace_s=drain_grace_s,
        )  # fmt: skip
        _check_service(base)
        stop_tracing = _tracing(otlp_endpoint)
    except SunroomError as exc:
        raise fail(one_line(exc)) from None
    try:
        sock = bind(base)
    except OSError as exc:
        raise fail(f"cannot listen on {base.host}:{base.port}: {one_line(exc)}") from None
    config = base.with_token()
    bound_port = sock.getsockname()[1]
    shown = f"[{config.host}]" if ":" in config.host else config.host
    typer.echo(f"sunroom service listening on http://{shown}:{bound_port}")
    if base.token:
        typer.echo("token: from SUNROOM_TOKEN")
    else:
        typer.echo(f"token: {config.token}")
    typer.echo(f"store: {config.store_label()}")
    if config.ui:
        typer.echo(f"web view: http://{shown}:{bound_port}/ (log in with the token)")
    sys.stdout.flush()
    logging.basicConfig(  # the service's errors, with their tracebacks, on stderr
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        guarded(lambda: run_server(config, sock=sock, log_level="warning"))
    finally:
        if stop_tracing is not None:
            stop_tracing()  # the spans still batched go out before the process ends


def _tracing(endpoint: str | None) -> Callable[[], None] | None:
    """Export traces over OTLP when asked (the option, or the standard variables); the stop.

    The variables alone, set for other programs where the ``otel`` extra is not installed,
    are a warning on stderr, not a failure. Raises UsageError for ``--otlp-endpoint`` without
    the extra, or for an endpoint that is no HTTP URL.
    """
    if endpoint is None:
        names = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        given = next((name for name in names if os.environ.get(name)), None)
        if given is None:
            return None
        if missing("otel") is not None:
            typer.echo(
                f"warning: {given} is set but the otel extra is not installed, so no traces "
                "are sent: pip install 'sunroom[otel]'",
                err=True,
            )
            return None
    from sunroom.tracing import export_otlp

    return export_otlp(endpoint)


def _templates(specs: list[str]) -> dict[str, str]:
    """``NAME=FILE`` options as name → setup code; exits with one line for a bad one."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name.isidentifier():
            raise fail(f"--template {spec!r} must be NAME=FILE with NAME a Python identifier")
        try:
            out[name] = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise fail(f"cannot read template {name!r} from {path}: {one_line(exc)}") from None
    return out


def _check_service(config: ServiceConfig) -> None:
    """Fail before serving when the default backend, model or host functions cannot work.

    Raises UsageError (also: an unknown kernel name, or ``--kernel-name`` / ``--sandbox``
    without ``--backend jupyter``), AuthenticationError (the default model has no API key).
    """
    from sunroom.service import load_functions, resolve_model

    choose_backend(
        config.backend, kernel_name=config.kernel_name, sandbox=config.sandbox, names=OPTION_NAMES
    )
    importable_here()  # the app imports them again (cached) in the same process
    load_functions(config.functions)
    if config.model is not None:
        asyncio.run(resolve_model(config.model, config.base_url).aclose())
