"""The tools ``sunroom mcp`` serves (:func:`server_tools`) and their structured results."""

from __future__ import annotations

import base64
import binascii
import json
import mimetypes
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, final
from urllib.parse import quote

import mcp_types as types
import pydantic

from sunroom.errors import FileError
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.result import DisplayItem, ExecutionResult
from sunroom.service.mcp.session_kernels import McpSettings, SessionKernels, Slot

__all__ = ["Tool", "failure", "server_tools"]

_IMAGE_ORDER: Final = ("image/png", "image/jpeg", "image/gif", "image/webp")


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


# -- the tools ----------------------------------------------------------------------------------

_Run = Callable[[SessionKernels, Slot, Any], Awaitable[types.CallToolResult]]


@final
@dataclass(frozen=True, slots=True)
class Tool:
    """A served tool: its MCP description, its arguments' model, and what runs it."""

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


def failure(message: str) -> types.CallToolResult:
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


def server_tools(settings: McpSettings) -> dict[str, Tool]:
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

    async def execute(kernels: SessionKernels, slot: Slot, a: ExecuteArgs) -> types.CallToolResult:
        kernel = await kernels.kernel(slot)
        r = await kernel.execute(a.code, timeout_s=a.timeout_s)
        content: list[types.ContentBlock] = [_text(_execute_text(r, limits))]
        content += [_display_content(item) for item in r.outputs]
        return _result(_execute_out(r), content, error=not r.ok)

    class NoArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="reset_kernel")

    async def reset(kernels: SessionKernels, slot: Slot, _: NoArgs) -> types.CallToolResult:
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

    async def list_files(kernels: SessionKernels, slot: Slot, a: ListArgs) -> types.CallToolResult:
        kernel = await kernels.kernel(slot)
        infos = await kernel.files.list(a.glob)
        files = [FileOut(**info.to_dict()) for info in infos]
        lines = [f"{f.path}/" if f.is_dir else f"{f.path}\t{f.size} bytes" for f in files]
        text = "\n".join(lines) if lines else f"no workdir entry matches {a.glob!r}"
        return _result(ListOut(files=files), [_text(text)])

    class ReadArgs(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid", title="read_file")
        path: str = pydantic.Field(description="A path relative to the kernel's workdir.")

    async def read_file(kernels: SessionKernels, slot: Slot, a: ReadArgs) -> types.CallToolResult:
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

    async def write_file(kernels: SessionKernels, slot: Slot, a: WriteArgs) -> types.CallToolResult:
        if a.encoding == "base64":
            try:
                data = base64.b64decode(a.content, validate=True)
            except binascii.Error:
                return failure("content is not valid base64")
        else:
            data = a.content.encode("utf-8")
        if len(data) > settings.max_file_bytes:
            return failure(
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
        "execute_code": Tool(
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
        "reset_kernel": Tool(
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
        "list_files": Tool(
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
        "read_file": Tool(
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
        "write_file": Tool(
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


def _agent_tool(settings: McpSettings) -> Tool:
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

    async def run_agent(_: SessionKernels, __: Slot, a: AgentArgs) -> types.CallToolResult:
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
    return Tool(tool, AgentArgs, run_agent)


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
