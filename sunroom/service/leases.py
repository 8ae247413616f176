"""Keeping sessions owned and taking over orphans: the session manager's background work.

:func:`renew_forever` renews this process's lease on each live session every third of
``lease_s`` and stops a session whose lease was lost (a renewal the store failed to write is
retried, not a loss). :func:`resume_forever` looks for
sessions whose owner's lease ran out (a crashed or stopped server) every ``lease_s / 2`` (at
most 0.5 s: a session a draining replica released is taken over at once) and
resumes them here; of several processes racing for one, exactly one wins the claim. A session
this process stopped because its events could not be stored (:mod:`sunroom.service.stalls`) is
never resumed here: it ends ``failed``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Container
from typing import Protocol

from sunroom.errors import StoreError
from sunroom.service.config import ServiceConfig
from sunroom.service.live import Live
from sunroom.service.problems import ConflictError, OwnedElsewhereError
from sunroom.store import EventStore

__all__ = ["LeaseHolder", "reclaim_own", "renew_forever", "resume_forever", "resume_orphans"]

log = logging.getLogger("sunroom.service")


class LeaseHolder(Protocol):
    """What this module uses of the session manager (which implements it)."""

    @property
    def config(self) -> ServiceConfig:
        """The service's configuration (``max_sessions``, ``lease_s``)."""
        ...

    @property
    def store(self) -> EventStore:
        """The open store the sessions and their leases are in."""
        ...

    @property
    def owner(self) -> str:
        """The owner string of this process."""
        ...

    @property
    def stalls(self) -> Container[str]:
        """Sessions stopped here because their events could not be stored."""
        ...

    @property
    def closed(self) -> bool:
        """Whether the manager is closing."""
        ...

    @property
    def live(self) -> int:
        """Sessions this process runs or is starting now (what ``max_sessions`` counts)."""
        ...

    def live_ids(self) -> list[str]:
        """Ids of the sessions this process runs now."""
        ...

    def is_live(self, sid: str) -> bool:
        """Whether this process runs session *sid*."""
        ...

    async def resume(self, sid: str) -> Live:
        """Claim session *sid* and run it here; ConflictError when another process won."""
        ...

    def drop(self, sid: str, exc: BaseException) -> None:
        """Stop running session *sid* here (its ownership was lost)."""
        ...


async def resume_orphans(manager: LeaseHolder) -> list[str]:
    """Resume every orphaned session the manager has room for; the ids it took.

    A session that cannot be resumed (its config no longer builds, its kernel cannot start) is
    recorded ``interrupted`` with the reason, so it is not tried forever.
    """
    taken: list[str] = []
    limit = manager.config.max_sessions
    for record in await manager.store.orphaned_sessions(limit=limit):
        if manager.closed or manager.live >= limit:
            break
        # read again: the list is a moment old, and a session this process stopped meanwhile
        # (a write failed) may have had its end recorded and its stall cleared since; the
        # stall check comes after the read, with no await before the resume's claim
        current = await manager.store.get_session(record.session_id)
        if current is None or current.status != "running":
            continue
        if record.session_id in manager.stalls:  # stopped here: its end is being recorded
            continue
        try:
            await manager.resume(record.session_id)
            taken.append(record.session_id)
        except (ConflictError, OwnedElsewhereError):
            continue  # another process won the claim
        except Exception as exc:
            log.error("resuming session %s failed", record.session_id, exc_info=exc)
            try:
                await manager.store.finish_session(
                    record.session_id,
                    status="interrupted",
                    result={"error": f"resume failed: {exc}"},
                    owner=None,
                )
            except Exception:
                log.exception("session %s: recording it interrupted failed", record.session_id)
    return taken


async def reclaim_own(manager: LeaseHolder) -> None:
    """Resume, at start, the ``running`` sessions this owner string held before a restart.

    Their lease has not run out, but the owner string is this process's (a stable identity,
    see :func:`~sunroom.service.live.stable_owner`), so the claim succeeds at once.
    """
    limit = manager.config.max_sessions
    for record in await manager.store.list_sessions(status="running", limit=10_000):
        if manager.closed or manager.live >= limit:
            break
        if record.owner != manager.owner or manager.is_live(record.session_id):
            continue
        if record.session_id in manager.stalls:
            continue
        try:
            await manager.resume(record.session_id)
        except ConflictError:
            continue
        except Exception as exc:
            log.error("reclaiming session %s failed", record.session_id, exc_info=exc)


async def renew_forever(manager: LeaseHolder) -> None:
    """Renew the lease of every live session, every ``lease_s / 3``, until cancelled.

    A session whose lease another process holds now is stopped here. A renewal that fails
    (the store cannot write: a full disk, I/O) is not a lost lease: the session goes on, the
    failure is logged once until a renewal succeeds again, and the next period retries. (Its
    writes stay fenced by ownership: should the lease run out and another process claim the
    session meanwhile, the next write here is refused and stops it.)
    """
    lease_s = manager.config.lease_s
    failing = False
    while True:
        await asyncio.sleep(lease_s / 3)
        failed = False
        for sid in manager.live_ids():
            try:
                ok = await manager.store.renew(sid, owner=manager.owner, lease_s=lease_s)
            except StoreError as exc:
                if not failing and not failed:
                    log.warning("renewing session leases failed (%s); retrying", exc)
                failed = True
                continue
            except Exception:
                log.exception("renewing session %s failed", sid)
                continue
            if not ok:
                manager.drop(sid, ConflictError("the session's lease was lost"))
        failing = failed


async def resume_forever(manager: LeaseHolder) -> None:
    """Resume orphaned sessions every ``lease_s / 2`` (0.2 s to 0.5 s), until cancelled.

    The period is short so that sessions released by a draining replica (no owner: orphaned
    at once) are resumed within half a second; each pass is one indexed query.
    """
    while True:
        try:
            await resume_orphans(manager)
        except Exception:
            log.exception("looking for orphaned sessions failed")
        await asyncio.sleep(max(0.2, min(0.5, manager.config.lease_s / 2)))
