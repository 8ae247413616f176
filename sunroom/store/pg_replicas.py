"""The PostgreSQL SQL of replicas and kernel placement (:mod:`sunroom.store.postgres`).

A replica says it is alive with a heartbeat that lapses after a time to live (an upsert); a raw
kernel of the service is placed on the replica that started it (the primary key makes a second
placement a conflict). Times come from the store's clock, in Python.
"""

from __future__ import annotations

from typing import Final

from sunroom.errors import StoreConflictError
from sunroom.store.pg_queries import Conn
from sunroom.store.queries import Clock
from sunroom.store.records import KernelPlacement, ReplicaRecord
from sunroom.store.replicas import (
    kernel_from_row,
    replica_from_row,
)

__all__ = [
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


async def heartbeat(
    conn: Conn,
    clock: Clock,
    replica_id: str,
    url: str,
    load: int,
    capacity: int,
    draining: bool,
    ttl_s: float,
) -> ReplicaRecord:
    """Insert or refresh the replica's row; it lapses *ttl_s* from now."""
    now = clock()
    await conn.execute(
        "INSERT INTO replicas (id, url, load, capacity, draining, heartbeat_at, expires_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET url = excluded.url,"
        " load = excluded.load, capacity = excluded.capacity, draining = excluded.draining,"
        " heartbeat_at = excluded.heartbeat_at, expires_at = excluded.expires_at",
        (replica_id, url, load, capacity, draining, now, now + ttl_s),
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


async def replicas(conn: Conn, clock: Clock) -> list[ReplicaRecord]:
    """The replicas whose heartbeat has not lapsed, by id."""
    cursor = await conn.execute(
        f'{_REPLICA} WHERE expires_at > %s ORDER BY id COLLATE "C"', (clock(),)
    )
    return [replica_from_row(row) for row in await cursor.fetchall()]


async def get_replica(conn: Conn, clock: Clock, replica_id: str) -> ReplicaRecord | None:
    """The replica's record, or None when it has none or its heartbeat lapsed."""
    cursor = await conn.execute(
        f"{_REPLICA} WHERE id = %s AND expires_at > %s", (replica_id, clock())
    )
    row = await cursor.fetchone()
    return None if row is None else replica_from_row(row)


async def leave(conn: Conn, replica_id: str) -> bool:
    """Delete the replica's row; whether there was one."""
    cursor = await conn.execute("DELETE FROM replicas WHERE id = %s", (replica_id,))
    return cursor.rowcount == 1


async def place_kernel(
    conn: Conn, clock: Clock, kernel_id: str, replica_id: str
) -> KernelPlacement:
    """Record that *replica_id* holds kernel *kernel_id*; conflict when it is placed already."""
    now = clock()
    cursor = await conn.execute(
        "INSERT INTO kernels (id, replica, created_at) VALUES (%s, %s, %s)"
        " ON CONFLICT (id) DO NOTHING",
        (kernel_id, replica_id, now),
    )
    if cursor.rowcount == 0:
        raise StoreConflictError(f"kernel {kernel_id!r} is placed already", reason="exists")
    return KernelPlacement(kernel_id=kernel_id, replica_id=replica_id, created_at=now)


async def kernel_placement(conn: Conn, kernel_id: str) -> KernelPlacement | None:
    """Where kernel *kernel_id* lives, or None."""
    cursor = await conn.execute(f"{_KERNEL} WHERE id = %s", (kernel_id,))
    row = await cursor.fetchone()
    return None if row is None else kernel_from_row(row)


async def forget_kernel(conn: Conn, kernel_id: str) -> bool:
    """Delete the kernel's placement; whether there was one."""
    cursor = await conn.execute("DELETE FROM kernels WHERE id = %s", (kernel_id,))
    return cursor.rowcount == 1


async def kernels_of(conn: Conn, replica_id: str) -> list[KernelPlacement]:
    """The kernels placed on *replica_id*, oldest first."""
    cursor = await conn.execute(
        f'{_KERNEL} WHERE replica = %s ORDER BY created_at, id COLLATE "C"', (replica_id,)
    )
    return [kernel_from_row(row) for row in await cursor.fetchall()]
