"""Request and response bodies of the HTTP API (pydantic), and a session's output schema.

A session's ``output_schema`` is a JSON Schema (draft 2020-12 unless its ``$schema`` names
another); :func:`output_type` checks it against its meta-schema and returns it as the
:class:`~sunroom.agent.schema.JsonSchema` that ``submit`` validates against with ``jsonschema``
on the host: every keyword the client sends is enforced. Only local ``$ref``s are allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from sunroom.agent.budget import Budget
from sunroom.agent.schema import JsonSchema
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
    code_mode: Literal["tool", "fenced"] = "tool"


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


def output_type(schema: Mapping[str, Any] | None) -> JsonSchema | None:
    """The checked JSON Schema ``submit`` must satisfy (None for None).

    Raises UsageError (one sentence naming the path in the schema) for an invalid schema.
    """
    if schema is None:
        return None
    return JsonSchema.parse(schema, what="output_schema")
