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

import asyncio
import base64
import binascii
import json
import mimetypes
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Final, Literal, final
from urllib.parse import quote

import mcp_types as types
import pydantic
import uvicorn
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from sunroom.errors import ClosedError, FileError, SunroomError, UsageError
from sunroom.sandbox.backends import DEFAULT_BACKEND
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.result import DisplayItem, ExecutionResult
from sunroom.service.problems import validation_message

__all__ = [
    "MAX_TIMEOUT_S",
    "McpSettings",
    "SessionKernels",
    "build_server",
    "check",
    "serve_http",
    "serve_stdio",
]

MAX_TIMEOUT_S: Final = 3600.0
"""The largest ``timeout_s`` any setting may allow ``execute_code``."""

_MIN_BODY_BYTES: Final = 4 * 1024 * 1024
"""The HTTP request body cap, raised to fit a ``write_file`` of ``max_file_bytes`` (base64)."""

_IMAGE_ORDER: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")
_SLOT_KEY: Final = "sunroom.kernel"
Transport = Literal["stdio", "http"]


@final
@dataclass(frozen=True, kw_only=True, slots=True)
class McpSettings:
    """How ``sunroom mcp`` runs its kernels and tools.

    Attributes:
        backend: the kernel backend (``bwrap`` by default; never a silent fallback).
        limits: every kernel's limits; ``limits.timeout_s`` is ``execute_code``'s default.
        max_timeout_s: the largest ``timeout_s`` a call may ask for (at most
            :data:`MAX_TIMEOUT_S`).
        max_file_bytes: the largest file ``read_file`` returns and ``write_file`` writes.
        models: models ``run_agent`` may use (``provider:name``); the first is the default.
            Empty: no ``run_agent`` tool.
        base_url: the endpoint of those models (``openai-compatible:``), if any.
        max_turns: model turns of one ``run_agent`` run.
        max_sessions: MCP sessions open at once over HTTP (one more is answered 503).
        session_idle_s: an HTTP session idle this long is ended, and its kernel closed.
    """

    backend: str = DEFAULT_BACKEND
    limits: Limits = field(default_factory=Limits)
    max_timeout_s: float = 600.0
    max_file_bytes: int = 8 * 1024 * 1024
    models: tuple[str, ...] = ()
    base_url: str | None = None
    max_turns: int = 20
    max_sessions: int = 16
    session_idle_s: float = 1800.0

    def __post_init__(self) -> None:
        if not 0 < self.max_timeout_s <= MAX_TIMEOUT_S:
            raise UsageError(
                f"the largest cell timeout must be in (0, {MAX_TIMEOUT_S:g}] s, "
                f"got {self.max_timeout_s:g}"
            )
        if self.limits.timeout_s > self.max_timeout_s:
            raise UsageError(
                f"the default cell timeout ({self.limits.timeout_s:g} s) is over the largest "
                f"one allowed ({self.max_timeout_s:g} s)"
            )
        if self.max_file_bytes <= 0:
            raise UsageError(f"the file size cap must be positive, got {self.max_file_bytes}")
        if self.max_turns <= 0:
            raise UsageError(f"max_turns must be positive, got {self.max_turns}")
        if self.max_sessions <= 0:
            raise UsageError(f"max_sessions must be positive, got {self.max_sessions}")
        if not 0 < self.session_idle_s < float("inf"):
            raise UsageError(f"the session idle time must be positive, got {self.session_idle_s:g}")


# -- the tools' structured results (their output schemas) ---------------------------------------


class _Out(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class CellErrorOut(_Out):
    """An exception raised by the cell, or why the cell was lost."""

    type: str
    message: str
    traceback: str


class DisplayOut(_Out):
    """One display output: its mime types (images are in the content) and its text form."""

    mime_types: list[str]
    text: str


class ExecuteOut(_Out):
    """The result of one cell."""

    status: Literal["ok", "error", "timeout", "died"]
    stdout: str
    stderr: str
    value: str | None
    error: CellErrorOut | None
    duration_s: float
    truncated_bytes: int
    state_lost: bool
    outputs: list[DisplayOut]
    dropped_outputs: int


class ResetOut(_Out):
    """Whether a kernel was closed (False: the session had none yet)."""

    closed: bool


class FileOut(_Out):
    """One workdir entry."""

    path: str
    size: int
    mtime: float
    is_dir: bool


class ListOut(_Out):
    """The workdir entries that match the glob, sorted by path."""

    files: list[FileOut]


class ReadOut(_Out):
    """What was read: the file is in the content, as text (utf-8) or a base64 blob."""

    path: str
    size: int
    encoding: Literal["utf-8", "base64"]
    mime_type: str


class WriteOut(_Out):
    """What was written."""

    path: str
    bytes_written: int


class AgentOut(_Out):
    """The outcome of one agent run."""

    status: str
    output: Any
    error: str | None
    turns: int
    model_calls: int
    cost_micro_usd: int | None
    session_id: str


# -- the per-session kernels --------------------------------------------------------------------


@final
class _Slot:
    """The kernel of one MCP session: started at its first use, closed with the session."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.kernel: AsyncKernel | None = None
        self.closed = False


@final
class SessionKernels:
    """The kernels of the open MCP sessions (the server's lifespan state).

    Every session gets a :class:`_Slot`; :meth:`aclose` (the server stopping) closes every
    kernel still open.
    """

    def __init__(self, settings: McpSettings) -> None:
        self.settings = settings
        self._slots: set[_Slot] = set()
        self._stdio_slot: _Slot | None = None

    def slot(self, connection: Connection | None) -> _Slot:
        """The slot of *connection*'s session (None: the one stdio client), made at first use."""
        if connection is None:
            if self._stdio_slot is None:
                self._stdio_slot = self._new()
            return self._stdio_slot
        slot = connection.state.get(_SLOT_KEY)
        if not isinstance(slot, _Slot):
            slot = self._new()
            connection.state[_SLOT_KEY] = slot
            connection.exit_stack.push_async_callback(self.release, slot)
        return slot

    def _new(self) -> _Slot:
        slot = _Slot()
        self._slots.add(slot)
        return slot

    async def kernel(self, slot: _Slot) -> AsyncKernel:
        """The slot's kernel, started now if it has none. Raises ClosedError, KernelError."""
        async with slot.lock:
            if slot.closed:
                raise ClosedError("the MCP session has ended")
            if slot.kernel is None:
                kernel = AsyncKernel(backend=self.settings.backend, limits=self.settings.limits)
                await kernel.start()
                slot.kernel = kernel
            return slot.kernel

    async def reset(self, slot: _Slot) -> bool:
        """Close the slot's kernel (the next use starts a fresh one); whether there was one."""
        async with slot.lock:
            kernel, slot.kernel = slot.kernel, None
        if kernel is None:
            return False
        await kernel.aclose()
        return True

    async def release(self, slot: _Slot) -> None:
        """Close the slot's kernel for good: its session ended.

        The slot is forgotten only once its kernel is closed: if this is cancelled (the SDK
        bounds a session's cleanup), :meth:`aclose` closes the kernel again at the server's stop.
        """
        slot.closed = True
        if slot.kernel is not None:
            await slot.kernel.aclose()
        slot.kernel = None
        self._slots.discard(slot)

    async def aclose(self) -> None:
        """Close every kernel still open; every one is tried, the first failure is raised."""
        slots, self._slots = list(self._slots), set()
        results = await asyncio.gather(*(self.release(s) for s in slots), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


# -- the tools ----------------------------------------------------------------------------------

_Run = Callable[[SessionKernels, _Slot, Any], Awaitable[types.CallToolResult]]


@final
@dataclass(frozen=True, slots=True)
class _Tool:
    tool: types.Tool
    args: type[pydantic.BaseModel]
    run: _Run


def _schema(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    return model.model_json_schema()


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _result(
    out: _Out, content: list[types.ContentBlock], *, error: bool = False
) -> types.CallToolResult:
    return types.CallToolResult(
        content=content, structured_content=out.model_dump(mode="json"), is_error=error
    )


def _failure(message: str) -> types.CallToolResult:
    """A tool that could not do its work: ``isError`` with one sentence, no structured content."""
    return types.CallToolResult(content=[_text(message)], is_error=True)


def _execute_text(r: ExecutionResult, limits: Limits) -> str:
    """The cell's result as the text a model reads: labelled sections, the caps' notes."""
    parts = []
    if r.stdout:
        parts.append(f"[stdout]\n{r.stdout.rstrip(chr(10))}")
    if r.stderr:
        parts.append(f"[stderr]\n{r.stderr.rstrip(chr(10))}")
    if r.value is not None:
        parts.append(f"[value]\n{r.value}")
    if r.error is not None:
        err = r.error.traceback or f"{r.error.type}: {r.error.message}"
        if r.status in ("timeout", "died") and r.error.message not in err:
            err = f"{err.rstrip()}\n{r.error.type}: {r.error.message}"
        parts.append(f"[{r.status}]\n{err.rstrip(chr(10))}")
    if r.state_lost:
        parts.append("[note] the kernel was restarted: its variables are gone")
    if r.truncated_bytes:
        parts.append(
            f"[note] {r.truncated_bytes} output bytes were dropped (the cap keeps the head and "
            f"tail of {limits.max_output_bytes} bytes per stream)"
        )
    if r.dropped_outputs:
        parts.append(
            f"[note] {r.dropped_outputs} display outputs were dropped (the cap is "
            f"{limits.display_bytes} bytes of display outputs per cell)"
        )
    return "\n".join(parts) if parts else "(no output)"


def _display_content(item: DisplayItem) -> types.ContentBlock:
    images = item.images
    for mime in _IMAGE_ORDER:
        if mime in images:
            data = base64.b64encode(images[mime]).decode("ascii")
            return types.ImageContent(type="image", data=data, mime_type=mime)
    return _text(str(item.data["text/plain"]))


def _execute_out(r: ExecutionResult) -> ExecuteOut:
    err = r.error
    return ExecuteOut(
        status=r.status,
        stdout=r.stdout,
        stderr=r.stderr,
        value=r.value,
        error=CellErrorOut(type=err.type, message=err.message, traceback=err.traceback)
        if err is not None
        else None,
        duration_s=r.duration_s,
        truncated_bytes=r.truncated_bytes,
        state_lost=r.state_lost,
        outputs=[
            DisplayOut(mime_types=sorted(i.data), text=str(i.data["text/plain"])) for i in r.outputs
        ],
        dropped_outputs=r.dropped_outputs,
    )


def _tools(settings: McpSettings) -> dict[str, _Tool]:
    """The tools of a server with *settings* (``run_agent`` only when it has models)."""
    limits = settings.limits

    class ExecuteArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="execute_code")
        code: str = pydantic.Field(description="Python source to run as one cell.")
        timeout_s: float = pydantic.Field(
            default=limits.timeout_s,
            gt=0,
            le=settings.max_timeout_s,
            description="Seconds the cell may run before it is interrupted (state is kept).",
        )

    async def execute(kernels: SessionKernels, slot: _Slot, a: ExecuteArgs) -> types.CallToolResult:
        kernel = await kernels.kernel(slot)
        r = await kernel.execute(a.code, timeout_s=a.timeout_s)
        content: list[types.ContentBlock] = [_text(_execute_text(r, limits))]
        content += [_display_content(item) for item in r.outputs]
        return _result(_execute_out(r), content, error=not r.ok)

    class NoArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="reset_kernel")

    async def reset(kernels: SessionKernels, slot: _Slot, _: NoArgs) -> types.CallToolResult:
        closed = await kernels.reset(slot)
        text = (
            "the kernel was closed; the next call starts a fresh one"
            if closed
            else "this session had no kernel yet; the next call starts a fresh one"
        )
        return _result(ResetOut(closed=closed), [_text(text)])

    class ListArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="list_files")
        glob: str = pydantic.Field(
            default="**/*", description="Workdir paths to list: ** spans folders, * does not."
        )

    async def list_files(kernels: SessionKernels, slot: _Slot, a: ListArgs) -> types.CallToolResult:
        kernel = await kernels.kernel(slot)
        infos = await kernel.files.list(a.glob)
        files = [FileOut(**info.to_dict()) for info in infos]
        lines = [f"{f.path}/" if f.is_dir else f"{f.path}\t{f.size} bytes" for f in files]
        text = "\n".join(lines) if lines else f"no workdir entry matches {a.glob!r}"
        return _result(ListOut(files=files), [_text(text)])

    class ReadArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="read_file")
        path: str = pydantic.Field(description="A path relative to the kernel's workdir.")

    async def read_file(kernels: SessionKernels, slot: _Slot, a: ReadArgs) -> types.CallToolResult:
        kernel = await kernels.kernel(slot)
        data = await _read_capped(kernel, a.path, settings.max_file_bytes)
        mime = mimetypes.guess_type(a.path)[0] or "application/octet-stream"
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            blob = types.BlobResourceContents(
                uri=f"sunroom://workdir/{quote(a.path)}",
                mime_type=mime,
                blob=base64.b64encode(data).decode("ascii"),
            )
            out = ReadOut(path=a.path, size=len(data), encoding="base64", mime_type=mime)
            return _result(out, [types.EmbeddedResource(type="resource", resource=blob)])
        out = ReadOut(path=a.path, size=len(data), encoding="utf-8", mime_type=mime)
        return _result(out, [_text(text)])

    class WriteArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="write_file")
        path: str = pydantic.Field(description="A path relative to the kernel's workdir.")
        content: str = pydantic.Field(description="The file's content, encoded as `encoding`.")
        encoding: Literal["utf-8", "base64"] = pydantic.Field(
            default="utf-8", description="utf-8 for text; base64 for binary content."
        )

    async def write_file(
        kernels: SessionKernels, slot: _Slot, a: WriteArgs
    ) -> types.CallToolResult:
        if a.encoding == "base64":
            try:
                data = base64.b64decode(a.content, validate=True)
            except binascii.Error:
                return _failure("content is not valid base64")
        else:
            data = a.content.encode("utf-8")
        if len(data) > settings.max_file_bytes:
            return _failure(
                f"the content is {len(data)} bytes, over the cap of {settings.max_file_bytes}"
            )
        kernel = await kernels.kernel(slot)
        written = await kernel.files.write(a.path, data)
        out = WriteOut(path=a.path, bytes_written=written)
        return _result(out, [_text(f"wrote {written} bytes to {a.path}")])

    caps = (
        f"Output is capped at {limits.max_output_bytes} bytes per stream (head and tail kept) "
        f"and {limits.display_bytes} bytes of display outputs per cell."
    )
    table = {
        "execute_code": _Tool(
            _tool(
                "execute_code",
                "Run Python in this session's persistent kernel (variables, imports and files "
                "persist across calls). The trailing expression's value is returned; figures "
                "and display() outputs come back as images. Errors and timeouts are results "
                f"with isError set. {caps}",
                ExecuteArgs,
                ExecuteOut,
            ),
            ExecuteArgs,
            execute,
        ),
        "reset_kernel": _Tool(
            _tool(
                "reset_kernel",
                "Throw this session's kernel away (variables and workdir files are lost); the "
                "next call starts a fresh one.",
                NoArgs,
                ResetOut,
            ),
            NoArgs,
            reset,
        ),
        "list_files": _Tool(
            _tool(
                "list_files",
                "List the files of the kernel's workdir that match a glob.",
                ListArgs,
                ListOut,
                read_only=True,
            ),
            ListArgs,
            list_files,
        ),
        "read_file": _Tool(
            _tool(
                "read_file",
                "Read a file of the kernel's workdir: text when it is UTF-8, else a base64 blob "
                f"resource; at most {settings.max_file_bytes} bytes.",
                ReadArgs,
                ReadOut,
                read_only=True,
            ),
            ReadArgs,
            read_file,
        ),
        "write_file": _Tool(
            _tool(
                "write_file",
                "Write a file in the kernel's workdir (folders are made); at most "
                f"{settings.max_file_bytes} bytes.",
                WriteArgs,
                WriteOut,
            ),
            WriteArgs,
            write_file,
        ),
    }
    if settings.models:
        table["run_agent"] = _agent_tool(settings)
    return table


def _tool(
    name: str,
    description: str,
    args: type[pydantic.BaseModel],
    out: type[pydantic.BaseModel],
    *,
    read_only: bool = False,
) -> types.Tool:
    return types.Tool(
        name=name,
        description=description,
        input_schema=_schema(args),
        output_schema=_schema(out),
        annotations=types.ToolAnnotations(read_only_hint=read_only, open_world_hint=False),
    )


def _agent_tool(settings: McpSettings) -> _Tool:
    from sunroom.agent.presets import PRESETS

    models = settings.models

    class AgentArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="run_agent")
        task: str = pydantic.Field(min_length=1, description="What the agent should do.")
        model: Literal[models] | None = pydantic.Field(  # type: ignore[valid-type]
            default=None, description=f"One of the configured models (default {models[0]})."
        )
        preset: Literal[PRESETS] | None = pydantic.Field(  # type: ignore[valid-type]
            default=None, description="codeact (default), rlm or typed."
        )

    async def run_agent(_: SessionKernels, __: _Slot, a: AgentArgs) -> types.CallToolResult:
        from sunroom.agent.session import AsyncSession
        from sunroom.service.models import resolve_model

        model = resolve_model(a.model or models[0], settings.base_url)
        try:
            async with AsyncSession(
                model=model,
                preset=a.preset or "codeact",
                backend=settings.backend,
                limits=settings.limits,
                max_turns=settings.max_turns,
            ) as session:
                r = await session.run(a.task)
        finally:
            await model.aclose()
        output = (
            r.output.model_dump(mode="json")
            if isinstance(r.output, pydantic.BaseModel)
            else r.output
        )
        out = AgentOut(
            status=r.status,
            output=output,
            error=r.error,
            turns=r.turns,
            model_calls=r.model_calls,
            cost_micro_usd=r.cost_micro_usd,
            session_id=r.session_id,
        )
        if r.status == "success":
            text = output if isinstance(output, str) else json.dumps(output)
        else:
            text = f"the run ended {r.status}: {r.error or 'no answer'}"
        return _result(out, [_text(text)], error=r.status != "success")

    tool = _tool(
        "run_agent",
        "Hand a task to a sunroom agent (a model that acts by writing Python in its own "
        "kernel) and return its answer.",
        AgentArgs,
        AgentOut,
    )
    return _Tool(tool, AgentArgs, run_agent)


async def _read_capped(kernel: AsyncKernel, path: str, cap: int) -> bytes:
    """The workdir file *path*, refused (FileError) when it is, or grows, over *cap* bytes."""
    size, stream = await kernel.files.read_sized(path)
    try:
        if size > cap:
            raise FileError(f"{path} is {size} bytes, over the cap of {cap}", reason="too_big")
        out = bytearray()
        async for chunk in stream:
            out += chunk
            if len(out) > cap:
                raise FileError(f"{path} grew over the cap of {cap} bytes", reason="too_big")
        return bytes(out)
    finally:
        await stream.aclose()


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
    tools = _tools(settings)

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
            return _failure(f"invalid arguments: {validation_message(exc)}")
        try:
            return await entry.run(ctx.lifespan_context, slot, args)
        except SunroomError as exc:
            return _failure(str(exc))

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


async def serve_http(
    settings: McpSettings,
    *,
    sock: socket.socket,
    token: str,
    host_allowed: Callable[[str], bool],
) -> None:
    """Serve streamable HTTP at ``/mcp`` on the listening *sock* until SIGINT/SIGTERM.

    Every request needs ``Authorization: Bearer <token>`` (401 otherwise) and a ``Host`` that
    *host_allowed* accepts (400 otherwise). At most ``settings.max_sessions`` MCP sessions are
    open at once (503 beyond); one idle for ``settings.session_idle_s`` is ended, and its kernel
    closed.
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
    guarded = HostCheck(BearerAuth(app, token=token, open_paths=()), allowed=host_allowed)
    config = uvicorn.Config(
        guarded,
        log_level="warning",
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    await _Uvicorn(config).serve(sockets=[sock])


class _Uvicorn(uvicorn.Server):
    """uvicorn, ending with exit status 0 on SIGINT/SIGTERM (the signal is not re-raised)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
