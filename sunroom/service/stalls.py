"""Sessions stopped because their events could not be stored: :class:`Stalls`.

A session's events go to the store before anyone sees them; when a write fails for a reason
other than lost ownership (a full disk, an I/O error), the session cannot go on: it is stopped
(its run cancelled, its kernel killed) and ends ``failed``, with a result saying that its
events could not be stored. It is never run again by this process, so a disk that was full is
not refilled by a re-run of the same work once space returns.

The end itself is a write (a ``SessionEnded`` event after the last stored one, then the
record), which may fail as long as the fault lasts: it is retried with exponential backoff
(:data:`FIRST_RETRY_S` doubling up to :data:`MAX_RETRY_S`), each step writing only what is not
stored yet. Meanwhile the session answers as ended: ``GET /sessions/{id}/result`` gives
``failed`` with that result, and a message is refused (503) rather than accepted unrecorded.
Once the end is stored the lease is given up; a later message starts a new run as for any
ended session. Should another server take the session over meanwhile (its lease ran out),
this process stops trying: the session is that server's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final, final

from sunroom.errors import StoreConflictError, StoreError
from sunroom.service.problems import public_message
from sunroom.service.recovery import RUN_ENDED
from sunroom.service.signals import Signals
from sunroom.store import EventStore, NewEvent

__all__ = ["FIRST_RETRY_S", "MAX_RETRY_S", "Stalls", "is_store_fault"]

log = logging.getLogger("sunroom.service")

FIRST_RETRY_S: Final = 0.5
"""The wait before the first retry of a stalled session's end; it doubles after each failure."""

MAX_RETRY_S: Final = 30.0
"""The longest wait between two retries of a stalled session's end."""


def is_store_fault(exc: BaseException) -> bool:
    """Whether *exc* is a store that failed to write (I/O, a full disk), not a lost lease."""
    return isinstance(exc, StoreError) and not isinstance(exc, StoreConflictError)


@final
class Stalls:
    """The sessions of one manager whose events could not be stored (see the module).

    Args:
        store: the manager's store.
        owner: the manager's owner string.
        signals: fired for a session once its end is stored (wakes SSE readers, ``/result``).
    """

    def __init__(self, store: EventStore, *, owner: str, signals: Signals) -> None:
        self._store = store
        self._owner = owner
        self._signals = signals
        self._results: dict[str, dict[str, object]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def stop(self, sid: str, exc: BaseException, *, next_seq: int) -> None:
        """Session *sid* stopped because a write failed with *exc*: record its end, retrying.

        *next_seq* is the seq its end event gets (one after the last stored event).
        """
        if sid in self._results:
            return
        error = (
            "the session stopped because its events could not be stored "
            f"({public_message(exc)}); nothing after its last stored event was kept"
        )
        result: dict[str, object] = {
            "status": "internal_error",
            "output": None,
            "error": error,
            "session_id": sid,
        }
        self._results[sid] = result
        self._tasks[sid] = asyncio.get_running_loop().create_task(
            self._record(sid, result, next_seq), name=f"sunroom-stalled-{sid[:8]}"
        )
        self._signals.fire(sid)

    def result(self, sid: str) -> dict[str, object] | None:
        """The result of stalled session *sid* (its record may still say ``running``), or None."""
        return self._results.get(sid)

    def __contains__(self, sid: object) -> bool:
        return sid in self._results

    def check(self, sid: str) -> None:
        """Raise StoreError (503) when session *sid* is stalled: it takes no message now."""
        if sid in self._results:
            raise StoreError(
                "the session stopped because its events could not be stored; it takes no "
                "message until its end is recorded (retry later)"
            )

    async def _record(self, sid: str, result: dict[str, object], next_seq: int) -> None:
        """Store the end of *sid* (event, record, release), retrying with backoff."""
        ended = recorded = False
        delay = FIRST_RETRY_S
        failures = 0
        try:
            while True:
                try:
                    if not ended:
                        event = NewEvent(
                            seq=next_seq, kind=RUN_ENDED, payload={"result": result}, ts=time.time()
                        )
                        await self._store.append(sid, [event], owner=self._owner)
                        ended = True
                    if not recorded:
                        await self._store.finish_session(
                            sid, status="failed", result=result, owner=self._owner
                        )
                        recorded = True
                    await self._store.release(sid, owner=self._owner)
                    log.info("session %s: its end (failed: events not stored) is recorded", sid)
                    return
                except StoreConflictError as exc:
                    if exc.reason == "seq":  # an event was stored after all: end after it
                        next_seq = (exc.last_seq or next_seq) + 1
                        continue
                    if exc.reason == "finished":  # its run's end is recorded already
                        recorded = True
                        continue
                    log.warning(
                        "session %s: not recording its end, another server owns it now (%s)",
                        sid,
                        exc.reason,
                    )
                    return
                except StoreError as exc:
                    failures += 1
                    if failures == 1:
                        log.warning(
                            "session %s: recording its end failed (%s); retrying with backoff "
                            "up to every %g s",
                            sid,
                            public_message(exc),
                            MAX_RETRY_S,
                        )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_RETRY_S)
        except Exception:
            log.exception("session %s: recording its end failed unexpectedly", sid)
        finally:
            del self._tasks[sid]
            del self._results[sid]
            self._signals.fire(sid)

    async def aclose(self) -> None:
        """Stop retrying (the process stops): a session left ``running`` is resumed later."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
