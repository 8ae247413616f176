"""What the session manager keeps per live session, and its small helpers.

:class:`Live` is one running session with its journal and model; :func:`new_owner` names this
process incarnation in the store; :func:`stable_owner` names a server of one store so that its
restart gets the same name back (and reclaims its own sessions at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sunroom.agent.session import AsyncSession
from sunroom.providers import Model
from sunroom.service.journal import Journal

__all__ = ["Identity", "Live", "ModelResolver", "new_owner", "stable_owner"]

ModelResolver = Callable[[str, "str | None"], Model]
"""``resolve(spec, base_url) -> Model``: builds a session's model (the caller closes it)."""


def new_owner() -> str:
    """A fresh owner string for this process incarnation (host, pid, random)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


_SLOTS = 256


@dataclass(slots=True)
class Identity:
    """A stable owner string held by an exclusive lock on its slot file (:func:`stable_owner`)."""

    owner: str
    fd: int

    def release(self) -> None:
        """Give the slot up (the process's death does the same)."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


def stable_owner(db_path: Path) -> Identity | None:
    """The owner string of the first free server slot of the store at *db_path*, locked.

    Slot *n* is ``<db>.owner-<n>`` (it keeps a random token, written once); its ``flock`` is
    held while this process lives and released by the kernel when it dies, ``kill -9``
    included. A restarted server takes the first free slot, normally the one its dead
    predecessor held, and with it the same owner string: every session that process owned is
    this one's again at once, and the lock proves the predecessor is gone. None when no slot
    can be locked (the caller falls back to :func:`new_owner`).
    """
    host = socket.gethostname()
    for n in range(_SLOTS):
        path = db_path.with_name(f"{db_path.name}.owner-{n}")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        token = os.read(fd, 64).decode(errors="replace").strip()
        if not token:
            token = uuid.uuid4().hex[:12]
            os.write(fd, token.encode())
            os.fsync(fd)
        return Identity(owner=f"{host}:slot{n}:{token}", fd=fd)
    return None


@dataclass(slots=True, eq=False)
class Live:
    """A session this process runs: the agent session, its journal, its model.

    ``sending`` counts the user messages being accepted (from the first look at the record to
    the hand-over to the session): each will start or join a run, so a run ending meanwhile
    must not record the session finished. ``record_lock`` orders the record's status changes
    (a run's end against a message's reopen).

    The idle policy (:mod:`sunroom.service.idle`) reads the rest: ``holds`` counts what keeps
    the session from being released although no run goes on (it is being created or resumed,
    an SSE reader follows it); ``last_used`` (``time.monotonic()``) is when it was last used
    (started, sent a message, ended a run, asked for its kernel or approvals), the start of
    its idle time; ``last_result`` is the result of its last run (None before the first).

    ``started`` is set once its kernel start ended, ``start_error`` then says how it failed
    (None: it runs); ``starting`` is the task that starts it in the background (a session
    created over HTTP is answered before its kernel is up).
    """

    sid: str
    session: AsyncSession
    journal: Journal
    model: Model
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    preamble: str | None = None
    sending: int = 0
    record_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    holds: int = 0
    last_used: float = field(default_factory=time.monotonic)
    last_result: dict[str, object] | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)
    start_error: BaseException | None = None
    starting: asyncio.Task[None] | None = None

    def touch(self) -> None:
        """Mark the session used now (its idle time starts again)."""
        self.last_used = time.monotonic()
