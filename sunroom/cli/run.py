"""``sunroom run TASK``: an agent session run here, rendered live (it is stored like a service one).

Everything the options can get wrong is checked before the session is recorded (exit 2, one
line on stderr). The run is shown live (:mod:`sunroom.cli.console`), or summed up as one
JSON object with ``--json``; approval requests are answered on the terminal
(:mod:`sunroom.cli.approvals`). Exit status: 0 success, 1 the run did not succeed, 2 usage or
setup error, 130 Ctrl-C (it prints the command that resumes the session).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Annotated, Any

import pydantic
import typer
from rich.console import Console

from sunroom.cli.network import AllowHostOption, network_from
from sunroom.cli.options import chosen_backend, file_inputs, inline_protocol, model_spec
from sunroom.cli.support import (
    DbOption,
    FunctionsOption,
    InlineImagesOption,
    JsonOption,
    KernelNameOption,
    SandboxOption,
    fail,
    finish_run,
    function_specs,
    open_manager,
    read_json,
)
from sunroom.sandbox.backends import DEFAULT_BACKEND, NAMES

__all__ = ["run"]


def _flag(field: str) -> str:
    """The ``sunroom run`` option that sets a session field (``max_turns`` → ``--max-turns``)."""
    return {"inputs": "--input", "files": "--input"}.get(field, f"--{field.replace('_', '-')}")


def run(
    task: Annotated[str, typer.Argument(help="What the agent should do.")],
    model: Annotated[
        str | None, typer.Option(metavar="PROVIDER:NAME", help="The model (or SUNROOM_MODEL).")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(metavar="URL", help="Model endpoint (or SUNROOM_BASE_URL).")
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            metavar="NAME=FILE",
            help="The file, read-only, as a pathlib.Path NAME (repeatable).",
        ),
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
    inline_images: InlineImagesOption = "auto",
    approval: Annotated[
        list[str] | None,
        typer.Option(
            "--approval",
            metavar="NAME=POLICY",
            help="NAME=allow|deny|ask: the approval policy of host functions (NAME may be a "
            "glob, e.g. 'github.*=ask'); ask is answered y/n on the terminal.",
        ),
    ] = None,
    auto_deny: Annotated[
        bool,
        typer.Option(help="Deny approval requests at once when stdin is not a terminal."),
    ] = False,
    allow_host: Annotated[list[str] | None, AllowHostOption] = None,
    functions: FunctionsOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run an agent session here and show it live (it is stored like a service session).

    --approval NAME=ask makes each call of a matching host function wait for an answer: the
    live view asks "[y]es / [n]o / [a]lways this run" on the terminal; without one, the call
    waits for its deadline, or is denied at once with --auto-deny (docs/approvals.md).

    Each --input NAME=FILE binds the host file read-only as a pathlib.Path NAME (as in
    sunroom exec); the stored session records its path, size and modification time, never its
    content, and a resumed session refuses a file that is gone or changed.

    Images the code displays are lines saying their type and size, or their path with
    --images DIR; --inline-images also shows them in terminals that speak the kitty or iTerm2
    graphics protocol (docs/cli.md).

    Everything the options can get wrong is checked before the session is recorded. Ctrl-C
    stops the run and prints the command that resumes it (exit 130).
    """
    from sunroom.agent.presets import PRESETS
    from sunroom.cli.approvals import parse_rules
    from sunroom.service.problems import validation_message
    from sunroom.service.schemas import CreateSession, FileInputIn

    if preset not in PRESETS:
        raise fail(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    if code_mode not in ("tool", "fenced"):
        raise fail(f"--code-mode must be tool or fenced, got {code_mode!r}")
    model = model_spec(model or os.environ.get("SUNROOM_MODEL"))
    if not model:
        raise fail("no model: pass --model provider:name or set SUNROOM_MODEL")
    if kernel_name is not None or sandbox is not None or backend is not None:
        default = os.environ.get("SUNROOM_BACKEND") or DEFAULT_BACKEND
        chosen_backend(backend or default, kernel_name, sandbox)  # its error, before recording
    files = {n: FileInputIn(path=os.fspath(f.path)) for n, f in file_inputs(inputs or []).items()}
    rules = parse_rules(approval or [], fail)
    net = network_from(allow_host or [], None)  # its error, before recording
    schema = None
    if output_schema is not None:
        schema = read_json(output_schema, what="the output schema")
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
    inline = inline_protocol(inline_images, console)
    sid = uuid.uuid4().hex  # known before anything runs: Ctrl-C says what to resume

    async def work() -> dict[str, object] | None:
        from sunroom.cli.approvals import Asker
        from sunroom.cli.console import Renderer, follow

        specs = function_specs(functions)
        async with open_manager(db, base_url=base_url, functions=specs) as manager:
            await manager.create(request, session_id=sid)
            renderer = Renderer(console, images=images, inline=inline, live=True)
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

    finish_run(sid, db, work, as_json=as_json)
