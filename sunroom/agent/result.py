"""The terminal result of one run: :class:`RunResult`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, final

from sunroom.providers import Usage

__all__ = ["RunResult", "Status"]

Status: TypeAlias = Literal[
    "success",
    "max_turns",
    "budget_exceeded",
    "timeout",
    "model_error",
    "length",
    "cancelled",
    "internal_error",
    "rejected",
]
"""How a run ended: a submitted (or final-text) answer, the turn limit, a spent budget, the
wall-time limit, a failed model call, a reply cut off by the output-token limit (never
retried), cancellation (the session was closed or the run's task cancelled), or an unexpected
exception on the host (a bug in sunroom, a hook or a custom model; logged with its
traceback), or a branched run whose ``choose`` callable turned down every branch."""

_Output: TypeAlias = Any  # type: ignore[explicit-any]  # the user's type: object would force casts
"""What ``RunResult.output`` holds: the session's output type, or text."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """The outcome of one run of a session.

    Attributes:
        status: see :data:`Status`.
        output: the submitted, validated value (an instance of the session's ``output`` type
            when it has one), else the model's final text; None when the run did not succeed.
        usage: tokens of every model call of this run, sub-calls included.
        cost_micro_usd: cost of those calls, or None when any model's price is unknown.
        turns: root model turns taken.
        model_calls: every model call (root and sub-calls).
        sub_calls: ``predict``/``predict_many`` model calls.
        session_id: the session's id.
        error: why the run did not succeed (redacted), or None.
    """

    status: Status
    output: _Output = None
    usage: Usage = Usage()
    cost_micro_usd: int | None = 0
    turns: int = 0
    model_calls: int = 0
    sub_calls: int = 0
    session_id: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the run succeeded."""
        return self.status == "success"
