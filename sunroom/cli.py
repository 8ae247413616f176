"""The ``sunroom`` command.

- ``sunroom exec [--backend NAME] [--timeout S] [--input NAME=FILE ...] [--json]
  [--output DIR [--output-glob P ...]] PATH|-`` runs a file (or stdin) of UTF-8 Python source
  in a fresh kernel and prints its output, or the whole result as JSON; each ``--input`` binds a
  host file read-only as a ``pathlib.Path``; ``--output`` copies the files it wrote into DIR.
  Exit status: 0 ok, 1 the code raised, 124 timeout, 125 the kernel died, 2 usage or setup
  error.
- ``sunroom serve [--host H] [--port P] [--db PATH] [--expose] [--model M] ...`` runs the
  HTTP/SSE service (raw kernels; agent sessions too when it has a model).
- ``sunroom run TASK [--model M] [--base-url URL] [--input NAME=FILE ...] [--output-schema
  FILE] [--backend B] [--code-mode tool|fenced] [--json]`` runs an agent session here, rendered
  live (or one JSON object with ``--json``). Exit status: 0 success, 1 the run did not
  succeed, 2 usage or setup error (nothing is recorded), 130 Ctrl-C (it says how to resume).
- ``sunroom mcp [--http [--host H] [--port P] [--expose]] [--backend B] [--model M ...]``
  serves kernels to MCP clients over stdio (or streamable HTTP with a bearer token):
  :mod:`sunroom.mcp.server`, docs/mcp.md.
- ``sunroom embed FILE --model PATH_OR_REPO [--query Q] [--k N] [--kind document|query]
  [--json]`` embeds one text per line with a local ONNX model and prints the vectors, or the
  top-k matches of a query (:mod:`sunroom.cli_embed`, docs/embeddings.md).
- ``sunroom sessions list|show|export|resume|purge`` looks after the sessions in the store
  (:mod:`sunroom.cli_sessions`; what the commands share is in :mod:`sunroom.cli_support`).

Every error sunroom reports is one line on stderr (``sunroom: ...``) that never shows a secret.
The model comes from ``--model``/``SUNROOM_MODEL`` (``scripted:FILE.json`` needs no key) and
``--base-url``/``SUNROOM_BASE_URL``; the store from ``--db``/``SUNROOM_DB``. See
``docs/cli.md``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import pydantic
import typer
from rich.console import Console

from sunroom.cli_embed import embed_command
from sunroom.cli_kernelspecs import kernelspecs_command
from sunroom.cli_network import AllowHostOption, named_networks, network_from
from sunroom.cli_sessions import sessions_app
from sunroom.cli_support import (
    DbOption,
    JsonOption,
    KernelNameOption,
    SandboxOption,
    fail,
    guarded,
    interrupted_exit,
    one_line,
    open_manager,
    read_text,
    run_summary,
)
from sunroom.errors import SunroomError
from sunroom.kernel_choice import OPTION_NAMES, choose_backend
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.backends import DEFAULT_BACKEND, NAMES
from sunroom.sandbox.files import copy_out
from sunroom.sandbox.inputs import File
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.result import CellError, ExecutionResult

if TYPE_CHECKING:
    from sunroom.mcp.servers import McpServer
    from sunroom.network.policy import Network
    from sunroom.service import ServiceConfig

EXIT_CODES = {"ok": 0, "error": 1, "timeout": 124, "died": 125}

T = TypeVar("T")

app = typer.Typer(
    name="sunroom",
    help="A fast, typed, isolated runtime for agents that act by writing Python.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # a traceback of a bug must not print keys in locals
)
app.add_typer(sessions_app, name="sessions")
app.command("kernelspecs")(kernelspecs_command)
app.command("embed")(embed_command)


@app.callback()
def _root() -> None:
    """A fast, typed, isolated runtime for agents that act by writing Python."""


async def _execute_once(
    code: str,
    *,
    backend: str | Backend,
    limits: Limits,
    inputs: dict[str, File] | None = None,
    output: Path | None = None,
    output_globs: Sequence[str] = (),
    mcp: Sequence[McpServer] = (),
    network: Network | None = None,
) -> ExecutionResult:
    """Run *code* in a fresh kernel that is closed afterwards: the one cell of ``exec``.

    The deadline is kept here, not by the kernel: at ``limits.timeout_s`` the cell gets SIGINT
    (it raises KeyboardInterrupt; the result is ``timeout``); if it is still running after
    ``limits.interrupt_grace_s`` the kernel is killed and, unlike the kernel's own timeout,
    no fresh one is started (nothing runs after this cell). With *output*, the workdir files
    matching *output_globs* (default all) are copied there after the cell, unless the kernel
    was lost. Raises what ``AsyncKernel`` raises.
    """
    async with AsyncKernel(
        backend=backend, limits=limits, inputs=inputs, mcp=mcp, network=network
    ) as kernel:
        result = await _run_cell(kernel, code, limits)
        if output is not None and not result.state_lost:
            await _copy_output(kernel, output, output_globs)
        return result


async def _copy_output(kernel: AsyncKernel, output: Path, globs: Sequence[str]) -> None:
    _, skipped = await copy_out(kernel.files, output, globs or ("**/*",))
    for rel in skipped:
        sys.stderr.write(f"sunroom: skipped {rel!r}: a link that leads out of the workdir\n")


async def _run_cell(kernel: AsyncKernel, code: str, limits: Limits) -> ExecutionResult:
    """Run *code* as the one cell, keeping the deadline here (see _execute_once)."""
    started = time.perf_counter()
    # the kernel's own timeout is out of the way; the waits below enforce the limit
    slack = limits.timeout_s + limits.interrupt_grace_s + 3600.0
    cell = asyncio.ensure_future(kernel.execute(code, timeout_s=slack))
    done, _ = await asyncio.wait({cell}, timeout=limits.timeout_s)
    if done:
        return cell.result()
    kernel.interrupt()
    done, _ = await asyncio.wait({cell}, timeout=limits.interrupt_grace_s)
    if not done:
        cell.cancel()
        await asyncio.wait({cell})
        message = (
            f"the cell ran past its {limits.timeout_s:g} s limit and ignored the interrupt; "
            "the kernel was killed"
        )
        return ExecutionResult(
            status="timeout",
            error=CellError("TimeoutError", message, ""),
            duration_s=time.perf_counter() - started,
            state_lost=True,
        )
    result = cell.result()
    if result.error is None or result.error.type != "KeyboardInterrupt":
        return result  # it finished (or failed) on its own just as the limit fired
    message = (
        f"the cell ran past its {limits.timeout_s:g} s limit and was interrupted "
        "(the kernel's state is kept)"
    )
    error = CellError("TimeoutError", message, result.error.traceback)
    return dataclasses.replace(result, status="timeout", error=error)


@app.command("exec")
def exec_(
    path: Annotated[str, typer.Argument(help="A Python file to run, or - for stdin.")],
    backend: Annotated[
        str, typer.Option(help=f"Kernel backend: {', '.join(NAMES)}.")
    ] = DEFAULT_BACKEND,
    timeout: Annotated[float, typer.Option(help="Seconds the code may run.")] = 30.0,
    memory_mb: Annotated[int, typer.Option(help="Memory limit in MB.")] = 2048,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", help="NAME=FILE: the file, read-only, as a pathlib.Path NAME."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(help="Copy the files the code wrote in its workdir into this directory."),
    ] = None,
    output_glob: Annotated[
        list[str] | None,
        typer.Option(
            help="Copy only workdir files matching this glob (repeatable; ** spans dirs)."
        ),
    ] = None,
    mcp: Annotated[
        Path | None,
        typer.Option(
            "--mcp",
            help='A JSON file of MCP servers ({"mcpServers": {...}}), each bound in the kernel '
            "as a module of its tools (docs/mcp.md).",
        ),
    ] = None,
    kernel_name: KernelNameOption = None,
    sandbox: SandboxOption = None,
    allow_host: Annotated[list[str] | None, AllowHostOption] = None,
    network: Annotated[
        Path | None,
        typer.Option(
            "--network",
            help="A JSON network policy (allow, inject, tls, ...; docs/network.md); "
            "--allow-host entries are added to its allowlist.",
        ),
    ] = None,
) -> None:
    """Run a file in a fresh kernel and print its output.

    Each ``--input NAME=FILE`` binds the host file read-only (mounted at /inputs/NAME on bwrap
    and docker) as the variable NAME, a ``pathlib.Path``; nothing is copied.

    ``--backend jupyter`` runs the file as one cell of an installed Jupyter kernel
    (``--kernel-name``, default python3: IPython's magics and ``!`` lines work) inside
    ``--sandbox`` (default bwrap); ``sunroom kernelspecs`` lists the kernels.

    ``--allow-host`` / ``--network FILE`` give the kernel a network policy: the hosts it
    allows are reachable through sunroom's egress proxy, nothing else is.

    Exit status: 0 ok, 1 the code raised, 124 timeout, 125 the kernel died, 2 usage or setup
    error (one line on stderr).
    """
    code = read_text(path, what="exec runs Python source")
    if not timeout > 0:
        raise fail(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if memory_mb <= 0:
        raise fail(f"--memory-mb must be a positive number of MB, got {memory_mb}")
    if output_glob and output is None:
        raise fail("--output-glob needs --output DIR")
    limits = Limits(timeout_s=timeout, memory_mb=memory_mb)
    chosen = _chosen_backend(backend, kernel_name, sandbox)
    files = _file_inputs(inputs or [])
    policy = network_from(allow_host or [], network)
    servers = _mcp_servers(mcp)
    if servers:
        from sunroom.mcp import from_config

        try:
            bound = from_config({"mcpServers": servers})
        except SunroomError as exc:
            raise fail(str(exc)) from None
    else:
        bound = []
    result = guarded(
        lambda: _execute_once(
            code,
            backend=chosen,
            limits=limits,
            inputs=files or None,
            output=output,
            output_globs=output_glob or (),
            mcp=bound,
            network=policy,
        )
    )
    if as_json:
        typer.echo(json.dumps(result.to_dict()))
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        if result.value is not None:
            sys.stdout.write(result.value + "\n")
        if result.status == "timeout":
            killed = "" if not result.state_lost else "; it ignored the interrupt and was killed"
            sys.stderr.write(f"sunroom: timed out after {timeout:g} s{killed}\n")
        elif result.error is not None:
            err = result.error
            text = err.traceback or f"{err.type}: {err.message}"
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
    raise typer.Exit(EXIT_CODES[result.status])


@app.command()
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
    functions: Annotated[
        str | None, typer.Option(help="Host functions, comma-separated module:attribute.")
    ] = None,
    lease_s: Annotated[float | None, typer.Option(help="Session lease in seconds.")] = None,
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
) -> None:
    """Run the HTTP/SSE service (token from SUNROOM_TOKEN, or generated and printed).

    With ``--backend jupyter``, ``--kernel-name`` and ``--sandbox`` are the defaults of jupyter
    kernels and sessions whose request names none.
    """
    from sunroom.service import ServiceConfig, bind
    from sunroom.service import serve as run_server

    fns = tuple(f.strip() for f in functions.split(",") if f.strip()) if functions else None
    templates = _templates(template or [])
    try:
        base = ServiceConfig.from_env(
            host=host, port=port, db_path=db, expose=expose or None, backend=backend,
            kernel_name=kernel_name, sandbox=sandbox,
            model=_model_spec(model or os.environ.get("SUNROOM_MODEL")), base_url=base_url,
            functions=fns, lease_s=lease_s, max_kernel_requests=max_kernel_requests,
            templates=templates or None, mcp_servers=_mcp_servers(mcp),
            networks=named_networks(network or []), client_network=client_network or None,
        )  # fmt: skip
        _check_service(base)
    except SunroomError as exc:
        raise fail(str(exc)) from None
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
    typer.echo(f"store: {config.db_path}")
    sys.stdout.flush()
    logging.basicConfig(  # the service's errors, with their tracebacks, on stderr
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    guarded(lambda: run_server(config, sock=sock, log_level="warning"))


def _chosen_backend(backend: str, kernel_name: str | None, sandbox: str | None) -> str | Backend:
    """The backend that ``--backend``, ``--kernel-name``, ``--sandbox`` name; exit 2 if none."""
    try:
        return choose_backend(backend, kernel_name=kernel_name, sandbox=sandbox, names=OPTION_NAMES)
    except SunroomError as exc:
        raise fail(str(exc)) from None


def _mcp_servers(path: Path | None) -> dict[str, Any] | None:
    """The ``mcpServers`` entries of the JSON file *path* (None: no file)."""
    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"cannot read the MCP config {path}: {one_line(exc)}") from None
    except ValueError as exc:
        raise fail(f"the MCP config {path} is not JSON: {one_line(exc)}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise fail(f'the MCP config {path} needs an object under "mcpServers"')
    return servers


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


def _model_spec(spec: str | None) -> str | None:
    """*spec*, with the file of a ``scripted:`` model made absolute (a resume may run elsewhere)."""
    if spec and spec.startswith("scripted:"):
        return f"scripted:{Path(spec.removeprefix('scripted:')).resolve()}"
    return spec


def _check_service(config: ServiceConfig) -> None:
    """Fail before serving when the default backend, model or host functions cannot work.

    Raises UsageError (also: an unknown kernel name, or ``--kernel-name`` / ``--sandbox``
    without ``--backend jupyter``), AuthenticationError (the default model has no API key).
    """
    from sunroom.service import load_functions, resolve_model

    choose_backend(
        config.backend, kernel_name=config.kernel_name, sandbox=config.sandbox, names=OPTION_NAMES
    )
    load_functions(config.functions)
    if config.model is not None:
        asyncio.run(resolve_model(config.model, config.base_url).aclose())


def _file_inputs(pairs: list[str]) -> dict[str, File]:
    """``--input NAME=FILE`` pairs as File inputs; exits 2 on a malformed pair or missing file."""
    out: dict[str, File] = {}
    for pair in pairs:
        name, sep, file = pair.partition("=")
        if not sep or not name.isidentifier() or not file:
            raise fail(f"--input takes NAME=FILE, got {pair!r}")
        if not os.path.isfile(file):
            raise fail(f"--input {name}: {file} is not a readable file")
        out[name] = File(file)
    return out


def _flag(field: str) -> str:
    """The ``sunroom run`` option that sets a session field (``max_turns`` → ``--max-turns``)."""
    return {"inputs": "--input", "files": "--input"}.get(field, f"--{field.replace('_', '-')}")


@app.command()
def run(
    task: Annotated[str, typer.Argument(help="What the agent should do.")],
    model: Annotated[str | None, typer.Option(help="provider:name (or SUNROOM_MODEL).")] = None,
    base_url: Annotated[
        str | None, typer.Option(help="Model endpoint (or SUNROOM_BASE_URL).")
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", help="NAME=FILE: the file, read-only, as a pathlib.Path NAME."),
    ] = None,
    output_schema: Annotated[
        Path | None, typer.Option(help="A JSON schema file the answer must satisfy.")
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help=f"Kernel backend: {', '.join(NAMES)}.")
    ] = None,
    kernel_name: KernelNameOption = None,
    sandbox: SandboxOption = None,
    preset: Annotated[str, typer.Option(help="codeact, rlm or typed.")] = "codeact",
    max_turns: Annotated[int, typer.Option(help="Model turns allowed.")] = 20,
    code_mode: Annotated[
        str,
        typer.Option(
            help="tool: the execute_code tool; fenced: ```python blocks, for models without "
            "tool calling (small local models)."
        ),
    ] = "tool",
    images: Annotated[
        Path | None,
        typer.Option(help="Save the images the code displays (plots ...) in this folder."),
    ] = None,
    approval: Annotated[
        list[str] | None,
        typer.Option(
            "--approval",
            help="NAME=allow|deny|ask: the approval policy of host functions (NAME may be a "
            "glob, e.g. 'github.*=ask'); ask is answered y/n on the terminal.",
        ),
    ] = None,
    auto_deny: Annotated[
        bool,
        typer.Option(help="Deny approval requests at once when stdin is not a terminal."),
    ] = False,
    allow_host: Annotated[list[str] | None, AllowHostOption] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run an agent session here and show it live (it is stored like a service session).

    ``--approval NAME=ask`` makes each call of a matching host function wait for an answer:
    the live view asks ``[y]es / [n]o / [a]lways this run`` on the terminal; without one, the
    call waits for its deadline, or is denied at once with ``--auto-deny`` (docs/approvals.md).

    Each ``--input NAME=FILE`` binds the host file read-only as a ``pathlib.Path`` (as in
    ``exec``); the stored session records its path, size and modification time, never its
    content, and a resumed session refuses a file that is gone or changed.

    Everything the options can get wrong is checked before the session is recorded. Ctrl-C
    stops the run and prints the command that resumes it (exit 130).
    """
    from sunroom.agent.presets import PRESETS
    from sunroom.cli_approvals import parse_rules
    from sunroom.service.problems import validation_message
    from sunroom.service.schemas import CreateSession, FileInputIn

    if preset not in PRESETS:
        raise fail(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if code_mode not in ("tool", "fenced"):
        raise fail(f"--code-mode must be tool or fenced, got {code_mode!r}")
    model = _model_spec(model or os.environ.get("SUNROOM_MODEL"))
    if not model:
        raise fail("no model: pass --model provider:name or set SUNROOM_MODEL")
    if kernel_name is not None or sandbox is not None or backend is not None:
        default = os.environ.get("SUNROOM_BACKEND") or DEFAULT_BACKEND
        _chosen_backend(backend or default, kernel_name, sandbox)  # its error, before recording
    files = {n: FileInputIn(path=os.fspath(f.path)) for n, f in _file_inputs(inputs or []).items()}
    rules = parse_rules(approval or [], fail)
    net = network_from(allow_host or [], None)  # its error, before recording
    schema = None
    if output_schema is not None:
        try:
            schema = json.loads(output_schema.read_text())
        except OSError as exc:
            raise fail(f"cannot read the output schema: {one_line(exc)}") from None
        except ValueError as exc:
            raise fail(f"the output schema {output_schema} is not JSON: {exc}") from None
    try:
        request = CreateSession(
            task=task, model=model, base_url=base_url, files=files, output_schema=schema,
            preset=preset, backend=backend, max_turns=max_turns,  # type: ignore[arg-type]
            kernel_name=kernel_name, sandbox=sandbox,  # type: ignore[arg-type]
            code_mode=code_mode, approvals=rules,  # type: ignore[arg-type]
            network=None if net is None else {"allow": list(net.allow)},  # type: ignore[arg-type]
        )  # fmt: skip
    except pydantic.ValidationError as exc:
        raise fail(validation_message(exc, field=_flag)) from None
    console = Console(stderr=as_json)
    sid = uuid.uuid4().hex  # known before anything runs: Ctrl-C says what to resume

    async def work() -> dict[str, Any] | None:
        from sunroom.cli_approvals import Asker
        from sunroom.service.console import Renderer, follow

        async with open_manager(db) as manager:
            await manager.create(request, session_id=sid)
            renderer = Renderer(console, images=images)
            asker = Asker(manager, sid, console, auto_deny=auto_deny)

            def show(event: Any) -> None:
                if not as_json:
                    renderer.show(event)
                asker.see(event)

            try:
                await follow(manager.store, manager.signals, sid, show)
            finally:
                renderer.close()
                await asker.aclose()
            _, result = await manager.result(sid, timeout_s=0)
            out: dict[str, Any] | None = result
            return out

    try:
        result = guarded(work)
    except KeyboardInterrupt:
        raise interrupted_exit(sid, db) from None
    summary = run_summary(sid, result)
    if as_json:
        typer.echo(json.dumps(summary))
    raise typer.Exit(0 if summary["status"] == "success" else 1)


@app.command()
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

    stdio by default (nothing but protocol frames on stdout); ``--http`` serves streamable
    HTTP at ``/mcp`` with a bearer token (SUNROOM_TOKEN, or generated and printed).
    """
    try:
        from sunroom.mcp import server as mcp_server
    except ImportError as exc:
        raise fail(f"sunroom mcp needs the MCP SDK: pip install 'sunroom[mcp]' ({exc})") from None

    models = model or ([os.environ["SUNROOM_MODEL"]] if os.environ.get("SUNROOM_MODEL") else [])
    chosen = _chosen_backend(
        backend or os.environ.get("SUNROOM_BACKEND") or DEFAULT_BACKEND, kernel_name, sandbox
    )
    try:
        settings = mcp_server.McpSettings(
            backend=chosen,
            limits=Limits(timeout_s=timeout, memory_mb=memory_mb), max_timeout_s=max_timeout,
            max_file_bytes=max_file_bytes, models=tuple(_model_spec(m) or m for m in models),
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


def main() -> None:
    """Entry point of the ``sunroom`` console script."""
    app()


if __name__ == "__main__":
    main()
