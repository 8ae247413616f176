"""The store's errors, branches of :class:`sunroom.errors.SunroomError`.

::

    SunroomError
    └── StoreError                  the store failed (I/O, a locked or corrupt database file)
        ├── StoreConflictError      a write lost a race or broke an invariant; nothing was written
        ├── StoreNotFoundError      no session (or call) with that id
        └── StoreVersionError       the database file was written by a newer sunroom

Bad arguments (an unknown status, a payload that is not JSON, a negative lease) raise
:class:`sunroom.errors.UsageError`, as everywhere else in sunroom.
"""

from __future__ import annotations

from typing import final

from sunroom.errors import SunroomError

__all__ = ["StoreConflictError", "StoreError", "StoreNotFoundError", "StoreVersionError"]


class StoreError(SunroomError):
    """The store failed: the database file could not be read or written (the operator acts)."""


@final
class StoreConflictError(StoreError):
    """A write was refused and nothing was written.

    ``reason`` says why, as a short token the caller can branch on:

    - ``"not_owner"``: the caller does not own the session (another owner claimed it);
    - ``"seq"``: the events do not continue exactly from the last stored seq (a gap or a
      duplicate); ``last_seq`` is the stored one, so the caller can resynchronise;
    - ``"exists"``: the session, or the call's start, is already recorded;
    - ``"finished"``: the call already has its one outcome, or the session's run already
      ended;
    - ``"not_started"``: a call was finished that was never recorded as started.
    """

    def __init__(
        self, message: str, *, reason: str, session_id: str, last_seq: int | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.session_id = session_id
        self.last_seq = last_seq


@final
class StoreNotFoundError(StoreError):
    """No session, or no call record, has that id (it never existed or was purged)."""


@final
class StoreVersionError(StoreError):
    """The database's schema is newer than this sunroom knows; upgrade sunroom to open it."""
