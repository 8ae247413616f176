"""What the session manager keeps per live session, and its small helpers.

:class:`Live` is one running session with its journal and model; :func:`new_owner` names this
process incarnation in the store; :func:`restore_transcript` puts a recorded transcript into a
fresh :class:`~sunroom.agent.AsyncSession`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sunroom.agent.session import AsyncSession
from sunroom.providers import Model
from sunroom.service.journal import Journal

__all__ = ["Live", "ModelResolver", "new_owner"]

ModelResolver = Callable[[str, "str | None"], Model]
"""``resolve(spec, base_url) -> Model``: builds a session's model (the caller closes it)."""


def new_owner() -> str:
    """A fresh owner string for this process incarnation (host, pid, random)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass(slots=True, eq=False)
class Live:
    """A session this process runs: the agent session, its journal, its model."""

    sid: str
    session: AsyncSession
    journal: Journal
    model: Model
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    preamble: str | None = None
