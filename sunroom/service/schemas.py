"""Request and response bodies of the HTTP API (pydantic), and JSON-schema output types.

A session's ``output_schema`` is a JSON schema (the subset models produce and pydantic emits:
``object`` with ``properties``/``required``, ``array`` with ``items``, ``string``,
``integer``, ``number``, ``boolean``, ``null``, ``enum``, ``anyOf``); :func:`output_type`
turns it into the pydantic type ``submit`` must satisfy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from sunroom.agent.budget import Budget
from sunroom.agent.schema import type_from_spec
from sunroom.errors import UsageError
from sunroom.sandbox.limits import Limits

__all__ = [
    "BudgetIn",
    "CreateKernel",
    "CreateSession",
    "Execute",
    "LimitsIn",
    "MessageIn",
    "output_type",
]

_Strict = pydantic.ConfigDict(extra="forbid")


class LimitsIn(pydantic.BaseModel):
    """Kernel limits a client may set (see :class:`sunroom.sandbox.limits.Limits`)."""

    model_config = _Strict

    timeout_s: float | None = None
    memory_mb: int | None = None
    cpu_s: int | None = None
    pids: int | None = None
    max_output_bytes: int | None = None

    def build(self) -> Limits:
        """The Limits (defaults for what is unset). Raises UsageError."""
        return Limits(**self.model_dump(exclude_none=True))


class BudgetIn(pydantic.BaseModel):
    """A session budget (see :class:`sunroom.agent.Budget`)."""

    model_config = _Strict

    max_model_calls: int | None = None
    max_tokens: int | None = None
    max_cost_micro_usd: int | None = None
    max_wall_s: float | None = None

    def build(self) -> Budget:
        """The Budget. Raises UsageError."""
        return Budget(**self.model_dump())


class CreateSession(pydantic.BaseModel):
    """``POST /sessions``: a session, and optionally its first task (which starts a run)."""

    model_config = _Strict

    model: str | None = None
    base_url: str | None = None
    preset: Literal["codeact", "rlm", "typed"] = "codeact"
    task: str | None = None
    inputs: dict[str, Any] = pydantic.Field(default_factory=dict)
    limits: LimitsIn | None = None
    budget: BudgetIn | None = None
    output_schema: dict[str, Any] | None = None
    max_turns: int = pydantic.Field(default=20, gt=0, le=1000)
    system_prompt: str | None = None
    backend: str | None = None


class MessageIn(pydantic.BaseModel):
    """``POST /sessions/{id}/messages``: a user message (starts a run when idle)."""

    model_config = _Strict

    text: str = pydantic.Field(min_length=1)


class CreateKernel(pydantic.BaseModel):
    """``POST /kernels``: a raw kernel."""

    model_config = _Strict

    backend: str | None = None
    inputs: dict[str, Any] = pydantic.Field(default_factory=dict)
    limits: LimitsIn | None = None


class Execute(pydantic.BaseModel):
    """``POST /kernels/{id}/execute``: one cell."""

    model_config = _Strict

    code: str
    timeout_s: float | None = pydantic.Field(default=None, gt=0)


_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "none"}


def _spec(schema: Any, defs: Mapping[str, Any], name: str, depth: int) -> dict[str, Any]:
    if depth > 20:
        raise UsageError("output_schema is nested too deeply")
    if not isinstance(schema, Mapping):
        raise UsageError("output_schema: every schema must be an object")
    ref = schema.get("$ref")
    if isinstance(ref, str):
        key = ref.rsplit("/", 1)[-1]
        if key not in defs:
            raise UsageError(f"output_schema: unresolved $ref {ref!r}")
        return _spec(defs[key], defs, key, depth + 1)
    if "enum" in schema:
        return {"kind": "literal", "values": list(schema["enum"])}
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return {"kind": "union", "options": [_spec(o, defs, name, depth + 1) for o in options]}
    kind = schema.get("type")
    if isinstance(kind, list):
        options = [_spec({**schema, "type": k}, defs, name, depth + 1) for k in kind]
        return {"kind": "union", "options": options}
    if kind in _SCALARS:
        return {"kind": _SCALARS[kind]}
    if kind == "array":
        return {"kind": "list", "item": _spec(schema.get("items", {}), defs, name, depth + 1)}
    if kind == "object" or "properties" in schema:
        props = schema.get("properties")
        if not props:
            return {"kind": "dict", "value": {"kind": "any"}}
        required = set(schema.get("required") or ())
        fields = []
        for field, sub in props.items():
            entry: dict[str, Any] = {
                "name": field,
                "type": _spec(sub, defs, field.title(), depth + 1),
            }
            if field not in required:
                entry["default"] = sub.get("default") if isinstance(sub, Mapping) else None
            fields.append(entry)
        title = schema.get("title") or name
        doc = schema.get("description")
        return {"kind": "object", "name": str(title), "doc": doc, "fields": fields}
    if not kind:
        return {"kind": "any"}
    raise UsageError(f"output_schema: unsupported type {kind!r}")


def output_type(schema: Mapping[str, Any] | None) -> Any:
    """The pydantic type a JSON schema describes (None for None). Raises UsageError."""
    if schema is None:
        return None
    defs = {**(schema.get("$defs") or {}), **(schema.get("definitions") or {})}
    return type_from_spec(_spec(schema, defs, "Output", 0))
