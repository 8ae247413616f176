"""What a session is configured with: :class:`SessionOptions`, checked once.

``AsyncSession`` and ``Session`` keep their explicit keyword signatures (what a user reads and
a type checker checks); each builds one :class:`SessionOptions` from them. The same record is
what :meth:`AsyncSession.from_options <sunroom.agent.session.AsyncSession.from_options>` takes,
what a fork or a branch is built from (the parent's options with a new id and transcript), what
a nested session (``predict(recursive=True)``) derives its own from, and what the service maps
a request to. Making one is cheap and touches nothing: no model is built, no kernel started.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import pydantic

from sunroom.agent.approvals import DEFAULT_TIMEOUT_S, Policy
from sunroom.agent.budget import Budget, Spend
from sunroom.agent.context import ContextPolicy
from sunroom.agent.hooks import Hooks
from sunroom.agent.presets import PRESETS, Preset
from sunroom.agent.redaction import Secrets
from sunroom.agent.schema import JsonSchema
from sunroom.errors import UsageError
from sunroom.providers import Message, Model
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.limits import Limits

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from sunroom.embeddings.functions import Embedder
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.sandbox.packages import Packages
    from sunroom.sandbox.template import Template

__all__ = ["Functions", "Inputs", "OutputSpec", "SessionOptions"]

Functions: TypeAlias = "Iterable[Callable[..., Any] | HostFunction]"  # type: ignore[explicit-any]  # any host function
"""Host functions to expose: plain callables (wrapped with ``host_function``) or ready ones."""

Inputs: TypeAlias = "Mapping[str, object] | pydantic.BaseModel | DataclassInstance | None"
"""Variables to bind: a mapping of names to values (``typed``: also a model/dataclass instance)."""

OutputSpec: TypeAlias = (
    "type[object] | types.UnionType | types.GenericAlias | JsonSchema | Mapping[str, object] | None"
)
"""What ``submit`` must satisfy: a pydantic model, a dataclass, any type pydantic validates, or a
JSON Schema (a mapping, or a checked :class:`~sunroom.agent.schema.JsonSchema`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionOptions:
    """Every option of a session, as :class:`~sunroom.agent.session.AsyncSession` documents it.

    The fields and their defaults are the session's keyword arguments, one for one. Creating
    the record checks what can be checked without building anything (the preset, the counts,
    the hooks, the id) and keeps *functions* as a tuple; everything else is checked when the
    session is built from it. Raises UsageError for an invalid option.
    """

    model: Model | str
    preset: Preset = "codeact"
    sub_model: Model | str | None = None
    backend: str | Backend = backends.DEFAULT_BACKEND
    limits: Limits | None = None
    functions: Functions = ()
    inputs: Inputs = None
    output: OutputSpec = None
    budget: Budget | None = None
    max_turns: int = 20
    max_output_chars: int = 5000
    secrets: Secrets | Mapping[str, str] | Iterable[str] = ()
    hooks: Hooks | None = None
    context: ContextPolicy | None = None
    system_prompt: str | None = None
    max_depth: int = 1
    predict_concurrency: int = 8
    code_tool: bool = True
    event_buffer: int = 1000
    session_id: str | None = None
    transcript: Sequence[Message] = ()
    spent: Spend | None = None
    template: Template | None = None
    mcp: Iterable[McpServer] | Toolset = ()
    approvals: Mapping[str, Policy] | None = None
    approval_timeout_s: float = DEFAULT_TIMEOUT_S
    embeddings: Embedder | None = None
    network: Network | None = None
    packages: Packages | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise UsageError(f"preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        for name, value in (
            ("max_turns", self.max_turns),
            ("max_output_chars", self.max_output_chars),
        ):
            if not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_depth, int) or self.max_depth < 1:
            raise UsageError(f"max_depth must be an int >= 1, got {self.max_depth!r}")
        if self.hooks is not None and not isinstance(self.hooks, Hooks):
            raise UsageError("hooks must be a sunroom.agent.Hooks")
        sid = self.session_id
        if sid is not None and (not isinstance(sid, str) or not sid):
            raise UsageError("session_id must be a non-empty str")
        object.__setattr__(self, "functions", tuple(self.functions))
