"""``sunroom exec PATH|-``: a file (or stdin) of Python source run as one cell of a fresh kernel.

It prints the cell's output, or the whole result as JSON (``--json``); each ``--input``
binds a host file read-only as a ``pathlib.Path``; ``--output`` copies the files it wrote into
a host directory (``--output-max-mb``, default 1024, in all). The deadline is kept here, not
by the kernel (:func:`_execute_once`). Exit status: :data:`EXIT_CODES` by the result's status
(0 ok, 1 the code raised, 124 timeout, 125 the kernel died), 2 usage or setup error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from sunroom.cli.network import AllowHostOption, network_from
from sunroom.cli.options import chosen_backend, file_inputs, mcp_servers
from sunroom.cli.support import KernelNameOption, SandboxOption, fail, guarded, read_text
from sunroom.errors import SunroomError
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.backends import DEFAULT_BACKEND, NAMES
from sunroom.sandbox.files import COPY_MAX_BYTES, copy_out
from sunroom.sandbox.inputs import File
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.result import CellError, ExecutionResult

if TYPE_CHECKING:
    from sunroom.mcp.servers import McpServer
    from sunroom.network.policy import Network

__all__ = ["EXIT_CODES", "exec_"]

EXIT_CODES = {"ok": 0, "error": 1, "timeout": 124, "died": 125}


async def _execute_once(
    code: str,
    *,
    backend: str | Backend,
    limits: Limits,
    inputs: dict[str, File] | None = None,
    output: Path | None = None,
    output_globs: Sequence[str] = (),
    output_max_bytes: int = COPY_MAX_BYTES,
    mcp: Sequence[McpServer] = (),
    network: Network | None = None,
    filename: str | None = None,
) -> ExecutionResult:
    """Run *code* in a fresh kernel that is closed afterwards: the one cell of ``exec``.

    *filename* names the code in its tracebacks and SyntaxErrors (the file given to exec).

    The deadline is kept here, not by the kernel: at ``limits.timeout_s`` the cell gets SIGINT
    (it raises KeyboardInterrupt; the result is ``timeout``); if it is still running after
    ``limits.interrupt_grace_s`` the kernel is killed and, unlike the kernel's own timeout,
    no fresh one is started (nothing runs after this cell). With *output*, the workdir files
    matching *output_globs* (default all) are copied there after the cell, unless the kernel
    was lost, *output_max_bytes* at most in all (``copy_out``: FileError(reason="too_big")
    past it). Raises what ``AsyncKernel`` raises.
    """
    async with AsyncKernel(
        backend=backend, limits=limits, inputs=inputs, mcp=mcp, network=network
    ) as kernel:
        result = await _run_cell(kernel, code, limits, filename)
        if output is not None and not result.state_lost:
            await _copy_output(kernel, output, output_globs, output_max_bytes)
        return result


async def _copy_output(
    kernel: AsyncKernel, output: Path, globs: Sequence[str], max_bytes: int
) -> None:
    _, skipped = await copy_out(kernel.files, output, globs or ("**/*",), max_bytes=max_bytes)
    for rel in skipped:
        sys.stderr.write(f"sunroom: skipped {rel!r}: a link that leads out of the workdir\n")


async def _run_cell(
    kernel: AsyncKernel, code: str, limits: Limits, filename: str | None = None
) -> ExecutionResult:
    """Run *code* as the one cell, keeping the deadline here (see _execute_once)."""
    started = time.perf_counter()
    # the kernel's own timeout is out of the way; the waits below enforce the limit
    slack = limits.timeout_s + limits.interrupt_grace_s + 3600.0
    cell = asyncio.ensure_future(kernel.execute(code, timeout_s=slack, filename=filename))
    try:
        return await _deadline(kernel, cell, limits, started)
    finally:  # Ctrl-C: the cell ends with the kernel's close, its error was never retrieved
        if not cell.done():
            cell.cancel()


async def _deadline(
    kernel: AsyncKernel,
    cell: asyncio.Future[ExecutionResult],
    limits: Limits,
    started: float,
) -> ExecutionResult:
    """*cell*'s result, interrupted at the limit and given up after the grace (_execute_once)."""
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
        typer.Option(
            "--input",
            metavar="NAME=FILE",
            help="The file, read-only, as a pathlib.Path NAME (repeatable).",
        ),
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
    output_max_mb: Annotated[
        int,
        typer.Option(
            help="Most MiB --output copies in all; more is an error (exit 2) before the file "
            "that would pass it is read."
        ),
    ] = COPY_MAX_BYTES >> 20,
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

    Each --input NAME=FILE binds the host file read-only (mounted at /inputs/NAME on bwrap and
    docker) as the variable NAME, a pathlib.Path; nothing is copied.

    --backend jupyter runs the file as one cell of an installed Jupyter kernel (--kernel-name,
    default python3: IPython's magics and ! lines work) inside --sandbox (default bwrap);
    sunroom kernelspecs lists the kernels.

    --allow-host / --network FILE give the kernel a network policy: the hosts it allows are
    reachable through sunroom's egress proxy, nothing else is.

    The whole file is one cell, sent in one protocol frame: at most 16,776,704 bytes.

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
    if output_max_mb <= 0:
        raise fail(f"--output-max-mb must be a positive number of MiB, got {output_max_mb}")
    limits = Limits(timeout_s=timeout, memory_mb=memory_mb)
    try:  # the whole file is one cell, sent in one protocol frame: refused before any kernel
        limits.check_code(code, what="stdin" if path == "-" else path)
    except SunroomError as exc:
        raise fail(str(exc)) from None
    chosen = chosen_backend(backend, kernel_name, sandbox)
    files = file_inputs(inputs or [])
    policy = network_from(allow_host or [], network)
    servers = mcp_servers(mcp)
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
            output_max_bytes=output_max_mb << 20,
            mcp=bound,
            network=policy,
            filename="<stdin>" if path == "-" else path,
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
        elif result.status == "died" and result.error is not None:
            sys.stderr.write(f"sunroom: {result.error.message}\n")  # exec has ended: no restart
        elif result.error is not None:
            err = result.error
            text = err.traceback or f"{err.type}: {err.message}"
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
    raise typer.Exit(EXIT_CODES[result.status])
