"""The SQL of replicas and kernel placement for :class:`~sunroom.store.sqlite.SQLiteStore`.

A replica (one ``sunroom serve`` process of several sharing a store) says it is alive with a
heartbeat that lapses after a time to live; a raw kernel of the service is placed on the replica
that started it. Same conventions as :mod:`sunroom.store.queries`: the store's connection on the
store's thread, writes in ``BEGIN IMMEDIATE`` transactions, the clock read once the lock is held.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Final

from sunroom.errors import StoreConflictError
from sunroom.store.queries import Clock, transaction
from sunroom.store.records import KernelPlacement, ReplicaRecord

__all__ = [
    "kernel_from_row",
    "replica_from_row",
    "forget_kernel",
    "get_replica",
    "heartbeat",
    "kernel_placement",
    "kernels_of",
    "leave",
    "place_kernel",
    "replicas",
]

_REPLICA: Final = "SELECT id, url, load, capacity, draining, heartbeat_at, expires_at FROM replicas"
_KERNEL: Final = "SELECT id, replica, created_at FROM kernels"


def replica_from_row(row: Sequence[Any]) -> ReplicaRecord:
    """A replica record from a row of ``_REPLICA``'s columns (both backends)."""
    return ReplicaRecord(
        replica_id=row[0],
        url=row[1],
        load=row[2],
        capacity=row[3],
        draining=bool(row[4]),
        heartbeat_at=row[5],
        expires_at=row[6],
    )


def kernel_from_row(row: Sequence[Any]) -> KernelPlacement:
    """A placement from a row of ``_KERNEL``'s columns (both backends)."""
    return KernelPlacement(kernel_id=row[0], replica_id=row[1], created_at=row[2])


def heartbeat(
    conn: sqlite3.Connection,
    clock: Clock,
    replica_id: str,
    url: str,
    load: int,
    capacity: int,
    draining: bool,
    ttl_s: float,
) -> ReplicaRecord:
    """Insert or refresh the replica's row; it lapses *ttl_s* from now."""
    with transaction(conn):
        now = clock()
        conn.execute(
            "INSERT INTO replicas (id, url, load, capacity, draining, heartbeat_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET url = excluded.url,"
            " load = excluded.load, capacity = excluded.capacity, draining = excluded.draining,"
            " heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at",
            (replica_id, url, load, capacity, int(draining), now, now + ttl_s),
        )
        return ReplicaRecord(
            replica_id=replica_id,
            url=url,
            load=load,
            capacity=capacity,
            draining=draining,
            heartbeat_at=now,
            expires_at=now + ttl_s,
        )


def replicas(conn: sqlite3.Connection, clock: Clock) -> list[ReplicaRecord]:
    """The replicas whose heartbeat has not lapsed, by id."""
    rows = conn.execute(f"{_REPLICA} WHERE expires_at > ? ORDER BY id", (clock(),)).fetchall()
    return [replica_from_row(row) for row in rows]


def get_replica(conn: sqlite3.Connection, clock: Clock, replica_id: str) -> ReplicaRecord | None:
    """The replica's record, or None when it has none or its heartbeat lapsed."""
    row = conn.execute(
        f"{_REPLICA} WHERE id = ? AND expires_at > ?", (replica_id, clock())
    ).fetchone()
    return None if row is None else replica_from_row(row)


def leave(conn: sqlite3.Connection, replica_id: str) -> bool:
    """Delete the replica's row; whether there was one."""
    with transaction(conn):
        return conn.execute("DELETE FROM replicas WHERE id = ?", (replica_id,)).rowcount == 1


def place_kernel(
    conn: sqlite3.Connection, clock: Clock, kernel_id: str, replica_id: str
) -> KernelPlacement:
    """Record that *replica_id* holds kernel *kernel_id*; conflict when it is placed already."""
    with transaction(conn):
        now = clock()
        if conn.execute("SELECT 1 FROM kernels WHERE id = ?", (kernel_id,)).fetchone():
            raise StoreConflictError(f"kernel {kernel_id!r} is placed already", reason="exists")
        conn.execute(
            "INSERT INTO kernels (id, replica, created_at) VALUES (?, ?, ?)",
            (kernel_id, replica_id, now),
        )
        return KernelPlacement(kernel_id=kernel_id, replica_id=replica_id, created_at=now)


def kernel_placement(conn: sqlite3.Connection, kernel_id: str) -> KernelPlacement | None:
    """Where kernel *kernel_id* lives, or None."""
    row = conn.execute(f"{_KERNEL} WHERE id = ?", (kernel_id,)).fetchone()
    return None if row is None else kernel_from_row(row)


def forget_kernel(conn: sqlite3.Connection, kernel_id: str) -> bool:
    """Delete the kernel's placement; whether there was one."""
    with transaction(conn):
        return conn.execute("DELETE FROM kernels WHERE id = ?", (kernel_id,)).rowcount == 1


def kernels_of(conn: sqlite3.Connection, replica_id: str) -> list[KernelPlacement]:
    """The kernels placed on *replica_id*, oldest first."""
    rows = conn.execute(
        f"{_KERNEL} WHERE replica = ? ORDER BY created_at, id", (replica_id,)
    ).fetchall()
    return [kernel_from_row(row) for row in rows]
