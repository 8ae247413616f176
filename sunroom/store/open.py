"""Which store a path or URL names: :func:`open_store`.

A plain path or a ``sqlite:///`` URL is a :class:`~sunroom.store.sqlite.SQLiteStore`; a
``postgresql://`` or ``postgres://`` URL is a :class:`~sunroom.store.postgres.PostgresStore`
(the ``postgres`` extra). Any other scheme is refused, naming the scheme and never echoing the
rest of the URL (it may hold a password).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from sunroom.errors import UsageError

if TYPE_CHECKING:
    from sunroom.store.seam import EventStore

__all__ = ["open_store"]

_SCHEME: Final = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_SUPPORTED: Final = "a file path, sqlite:///ABSOLUTE/PATH, postgresql:// or postgres://"


def open_store(spec: str, *, clock: Callable[[], float] = time.time) -> EventStore:
    """A new, unopened store for *spec* (use ``async with``); the scheme picks the backend.

    * ``/var/lib/sunroom/store.db``, ``store.db``, ``~/s.db`` (no ``scheme://``), or
      ``sqlite:///abs/path/store.db``: a SQLiteStore on that file.
    * ``postgresql://user:password@host:5432/dbname`` or ``postgres://...``: a PostgresStore
      on that DSN (raises UsageError naming the ``postgres`` extra when it is not installed).

    *clock* is the store's time source. Raises UsageError for any other scheme, for a
    ``sqlite://`` URL without an absolute path, and for an empty *spec*.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError("the store must be a non-empty path or URL")
    match = _SCHEME.match(spec)
    if match is None:
        from sunroom.store.sqlite import SQLiteStore

        return SQLiteStore(spec, clock=clock)
    scheme = match.group(1).lower()
    if scheme in ("postgresql", "postgres"):
        from sunroom.extras import require

        require("postgres", "a PostgreSQL store")
        from sunroom.store.postgres import PostgresStore

        return PostgresStore(scheme + spec[len(scheme) :], clock=clock)  # libpq: lower case
    if scheme == "sqlite":
        path = spec[match.end() :]
        if not path.startswith("/"):
            raise UsageError(
                "a sqlite:// store URL needs an absolute path after the scheme:"
                " sqlite:///abs/path/store.db"
            )
        from sunroom.store.sqlite import SQLiteStore

        return SQLiteStore(path, clock=clock)
    raise UsageError(f"the store URL's scheme {scheme!r} is not supported: use {_SUPPORTED}")
