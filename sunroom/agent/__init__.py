"""Agent sessions: an LLM that acts by writing Python in an isolated kernel.

``AsyncSession`` (async core) and ``Session`` (sync twin) run a model against a kernel with
``predict``/``predict_many``/``submit`` host functions, under a shared :class:`Budget`,
publishing typed events. See ``docs/agent.md``.
"""

from __future__ import annotations

from sunroom.agent import events
from sunroom.agent.approvals import ApprovalCall, ApprovalRequest, Decision
from sunroom.agent.budget import Budget, BudgetTracker
from sunroom.agent.bus import Subscription
from sunroom.agent.events import Event
from sunroom.agent.hooks import Hooks, Veto
from sunroom.agent.options import SessionOptions
from sunroom.agent.result import RunResult, Status
from sunroom.agent.session import AsyncSession
from sunroom.agent.sync import Session

__all__ = [
    "ApprovalCall",
    "ApprovalRequest",
    "AsyncSession",
    "Budget",
    "BudgetTracker",
    "Decision",
    "Event",
    "Hooks",
    "RunResult",
    "Session",
    "SessionOptions",
    "Status",
    "Subscription",
    "Veto",
    "events",
]
