"""The presets (``codeact``, ``rlm``, ``typed``) and how a model's reply becomes code to run.

All three share one loop: the model writes code, the kernel runs it, the model sees the output.
They differ in the prompt, in how inputs are bound, and in how a run ends: ``codeact`` without
an ``output`` type ends on a plain-text reply; ``rlm``, ``typed`` and any session with an
``output`` type end when ``submit`` accepts a value (a text-only reply is answered with a
reminder to submit).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Final, Literal, TypeAlias

import pydantic

from sunroom.errors import UsageError
from sunroom.providers import ToolSpec
from sunroom.sandbox.result import ExecutionResult

__all__ = [
    "EXECUTE_TOOL",
    "PRESETS",
    "Preset",
    "bind_inputs",
    "extract_code",
    "render_result",
    "truncate",
]

Preset: TypeAlias = Literal["codeact", "rlm", "typed"]
PRESETS: Final = ("codeact", "rlm", "typed")

EXECUTE_TOOL: Final = ToolSpec(
    "execute_code",
    "Run a cell of Python in the persistent kernel and return its output.",
    {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source of one cell"}},
        "required": ["code"],
    },
)

_FENCE: Final = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The ```python fenced blocks of *text* joined into one cell, or None when there is none."""
    blocks = [b.strip("\n") for b in _FENCE.findall(text)]
    blocks = [b for b in blocks if b.strip()]
    return "\n\n".join(blocks) if blocks else None


def without_code(text: str) -> str:
    """*text* with its ```python fenced blocks (what :func:`extract_code` runs) taken out."""
    return re.sub(r"\n{3,}", "\n\n", _FENCE.sub("", text)).strip()


def truncate(text: str, limit: int) -> tuple[str, int]:
    """*text* cut to about *limit* characters, head and tail kept; and how many were cut."""
    if len(text) <= limit:
        return text, 0
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    marker = f"\n[... {cut:,} characters cut; the data is still in the kernel ...]\n"
    return text[:head] + marker + text[len(text) - tail :], cut


def render_result(result: ExecutionResult) -> str:
    """A cell's result as text for the model, whole (redact, then :func:`truncate` it)."""
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.value is not None:
        parts.append(result.value)
    if result.error is not None:
        err = result.error
        tb = err.traceback.rstrip("\n")
        parts.append(tb if tb and err.message in tb else f"{tb}\n{err.type}: {err.message}".strip())
    if result.truncated_bytes:
        parts.append(f"[{result.truncated_bytes:,} bytes of output were dropped by the kernel]")
    if result.state_lost:
        parts.append("[the kernel was restarted: your variables are gone; inputs are bound again]")
    text = "\n".join(parts) if parts else "(no output)"
    if result.status != "ok":
        text = f"[status: {result.status}]\n{text}"
    return text


def bind_inputs(preset: str, inputs: object) -> tuple[dict[str, object], dict[str, str]]:
    """The variables to bind for *inputs*, and display type names for the prompt.

    ``typed``: a pydantic model or dataclass instance bound field by field (nested models as
    their data). Others: a mapping of names to values. Raises UsageError otherwise.
    """
    if inputs is None:
        return {}, {}
    if preset == "typed" and isinstance(inputs, pydantic.BaseModel):
        fields = type(inputs).model_fields
        values = {name: getattr(inputs, name) for name in fields}
        types = {name: _annotation(info.annotation) for name, info in fields.items()}
        return values, types
    if preset == "typed" and dataclasses.is_dataclass(inputs) and not isinstance(inputs, type):
        values = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
        types = {f.name: _annotation(f.type) for f in dataclasses.fields(inputs)}
        return values, types
    if isinstance(inputs, Mapping):
        return dict(inputs), {}
    raise UsageError(
        "inputs must be a mapping of variable names to values"
        + (" (or, for preset='typed', a pydantic model or dataclass instance)")
    )


def _annotation(tp: object) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")
