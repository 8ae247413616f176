"""The code-interpreter routes of the E2B facade: ``/execute``, ``/contexts``, ``/health``.

What E2B's code-interpreter server answers on a sandbox's port 49999, for its SDK's
``run_code`` and ``*_code_context`` calls:

* ``POST /execute`` ``{"code", "context_id"?, "language"?, "env_vars"?}`` streams
  newline-delimited JSON, one object per line: ``stdout`` / ``stderr`` (``text``, ``timestamp``
  in Unix nanoseconds) as the cell writes (a partial line is sent after
  :data:`PARTIAL_LINE_S`), then each ``result`` (the display items, then the main result with
  ``is_main_result``: a rich trailing value's bundle, or its ``repr`` as ``text``; E2B's field
  names: ``text``, ``html``, ``markdown``, ``svg``, ``png``, ``jpeg``, ``pdf``, ``latex``,
  ``json``, ``javascript``, ``data``, ``chart``, the other MIME types in ``extra``), an
  ``error`` (``name``, ``value``, ``traceback``), ``number_of_executions``, and last
  ``end_of_execution``. A ``keepalive`` line goes out after :data:`KEEPALIVE_S` of silence.
* The cell may run until the sandbox's end; when the client goes away (its ``timeout``), the
  cell is interrupted (``KeyboardInterrupt``; the context keeps its state) so the next
  execution does not wait behind it. When the sandbox is killed under a running cell, the
  response is cut off (no ``end_of_execution``), which the SDK reports as a killed sandbox.
* ``env_vars`` hold for this execution only: set before the cell, restored after it.
* ``/contexts``: create (``{"language"?, "cwd"?}``), list, ``POST /contexts/{id}/restart``,
  ``DELETE /contexts/{id}``. Python only: another language answers 501.

Errors are plain text, as E2B's server answers them: 404 for an unknown context, 400 for
``context_id`` with ``language``, 501 for what is not covered.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import logging
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import pydantic
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from sunroom.errors import SunroomError
from sunroom.sandbox.result import DisplayItem, ExecutionResult
from sunroom.service.bodies import parse_json
from sunroom.service.e2b.sandboxes import (
    PRELUDE,
    Context,
    Sandbox,
    Sandboxes,
    check_envs,
    language_of,
)
from sunroom.service.problems import public_message

__all__ = ["KEEPALIVE_S", "PARTIAL_LINE_S", "interpreter_routes"]

log = logging.getLogger("sunroom.service")

KEEPALIVE_S: Final = 5.0
"""A ``keepalive`` line is sent after this much silence during a cell."""

PARTIAL_LINE_S: Final = 0.1
"""Output without a newline yet is sent after this long."""


_FIELDS: Final = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

_JSON_TEXT: Final = frozenset({"e2b/data", "e2b/chart"})
"""MIME types whose value E2B's SDK takes as a dict, and the kernel sends as JSON text."""

Lookup = Callable[[Request], Awaitable[Sandbox]]


class ExecuteRequest(pydantic.BaseModel):
    """The body of ``POST /execute``."""

    model_config = pydantic.ConfigDict(extra="ignore")

    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[str, str] | None = None


class CreateContextRequest(pydantic.BaseModel):
    """The body of ``POST /contexts``."""

    model_config = pydantic.ConfigDict(extra="ignore")

    language: str | None = None
    cwd: str | None = None


def interpreter_routes(sandboxes: Sandboxes, lookup: Lookup) -> list[Route]:
    """The routes; *lookup* authenticates a request and finds its sandbox (or raises)."""
    routes = _Interpreter(sandboxes, lookup)
    return [
        Route("/execute", routes.execute, methods=["POST"]),
        Route("/contexts", routes.create_context, methods=["POST"]),
        Route("/contexts", routes.list_contexts, methods=["GET"]),
        Route("/contexts/{cid}/restart", routes.restart_context, methods=["POST"]),
        Route("/contexts/{cid}", routes.remove_context, methods=["DELETE"]),
        Route("/health", routes.health, methods=["GET"]),
    ]


def _context_json(ctx: Context) -> dict[str, str]:
    return {"id": ctx.context_id, "language": ctx.language, "cwd": ctx.cwd}


class _Interpreter:
    def __init__(self, sandboxes: Sandboxes, lookup: Lookup) -> None:
        self._sandboxes = sandboxes
        self._lookup = lookup

    async def health(self, request: Request) -> Response:
        await self._lookup(request)
        return JSONResponse("OK")

    async def create_context(self, request: Request) -> Response:
        sandbox = await self._lookup(request)
        body = CreateContextRequest.model_validate(await _json(request))
        ctx = await self._sandboxes.add_context(sandbox, body.language, body.cwd)
        return JSONResponse(_context_json(ctx))

    async def list_contexts(self, request: Request) -> Response:
        sandbox = await self._lookup(request)
        return JSONResponse([_context_json(ctx) for ctx in sandbox.contexts.values()])

    async def restart_context(self, request: Request) -> Response:
        sandbox = await self._lookup(request)
        await self._sandboxes.restart_context(sandbox, request.path_params["cid"])
        return JSONResponse(None)

    async def remove_context(self, request: Request) -> Response:
        sandbox = await self._lookup(request)
        await self._sandboxes.remove_context(sandbox, request.path_params["cid"])
        return JSONResponse(None)

    async def execute(self, request: Request) -> Response:
        sandbox = await self._lookup(request)
        body = ExecuteRequest.model_validate(await _json(request))
        if body.context_id is not None and body.language is not None:
            return PlainTextResponse(
                "Only one of context_id or language can be provided", status_code=400
            )
        if body.context_id is None:
            language_of(body.language)  # Unsupported (501) for anything but Python
        envs = body.env_vars or {}
        check_envs(envs)
        ctx = sandbox.context(body.context_id)
        code = _as_ipython(body.code)
        ctx.kernel.limits.check_code(code)  # refused before the stream starts (400)
        cell = _Cell(self._sandboxes, sandbox, ctx, code, envs)
        return StreamingResponse(cell.lines(), media_type="application/x-ndjson")


def _as_ipython(code: str) -> str:
    """*code* as E2B's IPython kernel reads it, in the two ways its users rely on.

    The indentation all lines share is dropped; and when the cell is not valid Python, each
    ``!pip install ...`` / ``%pip install ...`` line becomes a call of the kernel's
    ``pip_install`` (:mod:`sunroom.prelude.e2b`: what is installed already is reported as
    such, the rest goes through the kernel's ``install()``). Other shell escapes and magics
    are left as they are (a SyntaxError: commands are not covered).
    """
    if code[:1].isspace():
        code = textwrap.dedent(code)
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        pass
    else:
        return code
    lines = code.split("\n")
    for i, line in enumerate(lines):
        body = line.lstrip()
        words = body[1:].split()
        if body[:1] in "!%" and words[:2] == ["pip", "install"]:
            wanted = [w for w in words[2:] if not w.startswith("-")]
            indent = line[: len(line) - len(body)]
            lines[i] = f"{indent}{PRELUDE}.pip_install({wanted!r})"
    return "\n".join(lines)


async def _json(request: Request) -> Any:
    return parse_json(await request.body())


class SandboxKilled(Exception):  # noqa: N818 - not an error of the facade's: a cut-off stream
    """Raised inside a response stream to cut it off: the sandbox was killed under the cell."""


class _Cell:
    """One execution: runs the cell in a task and turns its output into E2B's lines."""

    def __init__(
        self,
        sandboxes: Sandboxes,
        sandbox: Sandbox,
        ctx: Context,
        code: str,
        envs: Mapping[str, str],
    ) -> None:
        self.sandboxes = sandboxes
        self.sandbox = sandbox
        self.ctx = ctx
        self.code = code
        self.envs = dict(envs)
        self.queue: asyncio.Queue[tuple[str, str] | ExecutionResult | BaseException] = (
            asyncio.Queue()
        )
        self.running = False  # the cell itself runs (not waiting for the context, not envs)

    async def lines(self) -> AsyncIterator[bytes]:
        task = asyncio.create_task(self._run(), name="sunroom-e2b-cell")
        try:
            async for line in self._stream():
                yield line
        finally:
            if not task.done():  # the client went away: stop the cell, keep the context
                if self.running:
                    self.ctx.kernel.interrupt()
                else:
                    task.cancel()
                # the task finishes on its own (the interrupted cell, the env reset)
                task.add_done_callback(_log_failure)

    async def _stream(self) -> AsyncIterator[bytes]:
        pending = {"stdout": "", "stderr": ""}
        while True:
            partial = any(pending.values())
            try:
                item = await asyncio.wait_for(
                    self.queue.get(), PARTIAL_LINE_S if partial else KEEPALIVE_S
                )
            except TimeoutError:
                if partial:
                    for stream in pending:
                        if pending[stream]:
                            yield _output(stream, pending[stream])
                            pending[stream] = ""
                else:
                    yield _line({"type": "keepalive"})
                continue
            if isinstance(item, tuple):
                stream, text = item
                pending[stream] += text
                cut = pending[stream].rfind("\n") + 1
                if cut:
                    yield _output(stream, pending[stream][:cut])
                    pending[stream] = pending[stream][cut:]
                continue
            for stream in pending:
                if pending[stream]:
                    yield _output(stream, pending[stream])
            if not self.sandbox.alive:  # cut the response off: the SDK reports a killed sandbox
                raise SandboxKilled(f"the sandbox {self.sandbox.sandbox_id} was killed")
            if isinstance(item, BaseException):
                for line in _failure_lines(item, self.ctx.executions):
                    yield line
            else:
                for line in _result_lines(item, self.ctx.executions):
                    yield line
            return

    async def _run(self) -> None:
        ctx = self.ctx
        try:
            async with ctx.lock:
                ctx.sink = self._sink
                try:
                    if self.envs:
                        await self._setup(f"{PRELUDE}.push_env({self.envs!r})")
                    ctx.executions += 1
                    remaining = max(1.0, self.sandbox.end_at - time.time())
                    self.running = True
                    try:
                        out = await ctx.kernel.execute(self.code, timeout_s=remaining)
                    finally:
                        self.running = False
                    if out.state_lost:  # a new kernel: E2B's behaviour and the sandbox's env
                        await self.sandboxes.prepare_again(self.sandbox, ctx)
                    elif self.envs:
                        await self._setup(f"{PRELUDE}.pop_env()")
                finally:
                    ctx.sink = None
            self.queue.put_nowait(out)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.queue.put_nowait(exc)

    async def _setup(self, code: str) -> None:
        out = await self.ctx.kernel.execute(code, timeout_s=30.0)
        if not out.ok:
            detail = out.error.message if out.error is not None else out.status
            raise SunroomError(f"the execution's environment could not be set: {detail}")

    def _sink(self, stream: str, text: str) -> None:
        if stream in ("stdout", "stderr"):
            self.queue.put_nowait((stream, text))


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("an abandoned E2B cell failed", exc_info=task.exception())


def _line(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _output(stream: str, text: str) -> bytes:
    return _line({"type": stream, "text": text, "timestamp": time.time_ns()})


def _result_lines(out: ExecutionResult, count: int) -> list[bytes]:
    lines: list[bytes] = []
    main_shown = False
    for item in out.outputs:
        main = _is_main(item)
        main_shown = main_shown or main
        lines.append(_line(_result(item.data, main)))
    if out.value is not None and not main_shown:
        lines.append(_line(_result({"text/plain": out.value}, True)))
    if out.error is not None:
        error = {"name": out.error.type, "value": out.error.message}
        lines.append(_line({"type": "error", **error, "traceback": out.error.traceback}))
    lines.append(_line({"type": "number_of_executions", "execution_count": count}))
    lines.append(_line({"type": "end_of_execution"}))
    return lines


def _failure_lines(exc: BaseException, count: int) -> list[bytes]:
    """A failure around the cell (not in it) as an E2B ``error``, then the end."""
    if isinstance(exc, SunroomError):
        message = public_message(exc)
    else:
        log.error("an E2B execution failed", exc_info=exc)
        message = "the server failed; its log has the details"
    return [
        _line({"type": "error", "name": type(exc).__name__, "value": message, "traceback": ""}),
        _line({"type": "number_of_executions", "execution_count": count}),
        _line({"type": "end_of_execution"}),
    ]


def _is_main(item: DisplayItem) -> bool:
    own = item.metadata.get("sunroom")
    return isinstance(own, Mapping) and own.get("execute_result") is True


def _result(data: Mapping[str, Any], main: bool) -> dict[str, Any]:
    """One display bundle in E2B's shape (a quoted ``text`` loses its quotes, as E2B's does)."""
    out: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        if isinstance(value, bytes):
            value = base64.b64encode(value).decode("ascii")
        name = _FIELDS.get(mime)
        if mime in _JSON_TEXT and isinstance(value, str):
            try:  # the kernel sends these as JSON text (the wire carries JSON only in *json)
                value = json.loads(value)
            except ValueError:
                name = None  # not E2B's shape: kept as it came, under extra
        if name is None:
            extra[mime] = value
        else:
            out[name] = value
    text = out.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    if isinstance(text, str) and not text:
        del out["text"]  # a raw bundle without text/plain
    if extra:
        out["extra"] = extra
    return out
