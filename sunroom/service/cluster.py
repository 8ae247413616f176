"""Replicas of one store: heartbeats, where a request belongs, placement and draining.

Several ``sunroom serve`` processes (replicas) share one store (PostgreSQL across hosts, or a
SQLite file on one host). The unit of distribution is the session: its agent loop and its
kernel stay on the replica that holds its lease, so host calls stay local. A raw kernel stays
on the replica that started it.

:class:`Cluster` is this replica's part:

- **Heartbeats.** Every ``heartbeat_s`` it records its internal URL (``advertise_url``), its
  load (live sessions and kernels) and capacity, and whether it drains, with a time to live of
  ``lease_s``: a replica killed with SIGKILL drops out of the cluster when its record lapses,
  as its sessions' leases do.
- **Where a request belongs** (:meth:`session_home`, :meth:`kernel_home`): reads are served
  by any replica from the store; a write to a session goes to the replica that holds its lease,
  and any request to a raw kernel to the replica that holds the kernel. A raw kernel whose
  replica is gone is never silently replaced: it is :class:`~sunroom.service.problems.KernelLost`
  until the caller deletes it.
- **Placement** (:meth:`place`): a new session or kernel samples ``placement_sample`` live,
  non-draining replicas at random (this one among them) and takes the least loaded, so the
  cluster balances without a coordinator (the power of d choices); when every live replica is
  full, :class:`~sunroom.service.problems.CapacityError` (429, ``Retry-After``).
- **Draining** (:meth:`drain`): a replica told to stop says so at once, takes no new work and
  is skipped by placement; the session manager then stops its runs and releases their leases.

Without ``advertise_url`` the replica takes part in no cluster: everything is served here, as
one server does (a session another process holds answers 503 with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Callable
from typing import Final, final

from sunroom.service.config import ServiceConfig
from sunroom.service.problems import CapacityError, KernelLost
from sunroom.store import EventStore, ReplicaRecord

__all__ = ["HEARTBEAT_MAX_S", "Cluster"]

log = logging.getLogger("sunroom.service")

HEARTBEAT_MAX_S: Final = 1.0
"""The longest time between two heartbeats (shorter when ``lease_s / 3`` is)."""

_REMEMBERED: Final = 100_000
"""Kernel placements routing remembers (the oldest are forgotten first)."""


@final
class Cluster:
    """A replica's membership of the cluster sharing *store* (see the module).

    Args:
        store: the open store shared by the replicas.
        config: ``advertise_url``, ``lease_s``, ``placement_sample``, the capacities.
        replica_id: this replica's owner string (the session manager's).
        load: the sessions and kernels this replica runs now.
        rng: the random source of placement (tests seed one).
    """

    def __init__(
        self,
        store: EventStore,
        *,
        config: ServiceConfig,
        replica_id: str,
        load: Callable[[], int],
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.replica_id = replica_id
        self.url = config.advertise_url
        self.capacity = config.max_sessions + config.max_kernels
        self.draining = False
        self._load = load
        self._rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None
        self._beat_now = asyncio.Event()
        # what routing remembers, so a forwarded request costs no store round trip: where each
        # raw kernel lives (a kernel never moves) and each replica's record, for one heartbeat
        self._placements: dict[str, str] = {}
        self._records: dict[str, tuple[float, ReplicaRecord | None]] = {}

    @property
    def enabled(self) -> bool:
        """Whether this replica takes part in a cluster (it has an ``advertise_url``)."""
        return self.url is not None

    @property
    def heartbeat_s(self) -> float:
        """Seconds between heartbeats."""
        return min(HEARTBEAT_MAX_S, self.config.lease_s / 3)

    async def start(self) -> None:
        """Join: the first heartbeat is written before this returns, then one every period."""
        if not self.enabled:
            return
        await self._heartbeat()
        self._task = asyncio.get_running_loop().create_task(
            self._beat_forever(), name="sunroom-heartbeat"
        )

    async def aclose(self) -> None:
        """Leave: stop the heartbeats and delete this replica's record."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
            if not task.cancelled() and task.exception() is not None:
                log.error("the heartbeat task failed", exc_info=task.exception())
        if self.enabled:
            try:
                await self.store.leave(self.replica_id)
            except Exception:
                log.exception("leaving the cluster failed (the record lapses by itself)")

    def drain(self) -> None:
        """Take no new work from now on; the next heartbeat (at once) says so."""
        self.draining = True
        self._beat_now.set()

    async def _heartbeat(self) -> ReplicaRecord:
        assert self.url is not None
        return await self.store.heartbeat(
            self.replica_id,
            url=self.url,
            load=max(0, self._load()),
            capacity=self.capacity,
            draining=self.draining,
            ttl_s=self.config.lease_s,
        )

    async def _beat_forever(self) -> None:
        failing = False
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat_now.wait(), self.heartbeat_s)
            self._beat_now.clear()
            try:
                await self._heartbeat()
                failing = False
            except Exception as exc:
                if not failing:
                    log.warning("the replica's heartbeat failed (%s); retrying", exc)
                failing = True

    # --- where a request belongs --------------------------------------------------------------

    async def session_home(self, sid: str, *, here: bool) -> str | None:
        """The URL of the replica that holds session *sid*'s lease, or None to serve it here.

        *here*: this replica runs the session now. A session that is unowned, whose lease
        ran out, or whose holder is not a live replica of the cluster is served here (the
        session manager resumes it, or answers as one server does).
        """
        if here or not self.enabled:
            return None
        record = await self.store.get_session(sid)
        if record is None or record.owner is None or record.owner == self.replica_id:
            return None
        if record.status != "running":
            return None
        holder = await self._replica(record.owner)
        if holder is None or holder.replica_id == self.replica_id:
            return None
        return holder.url

    async def kernel_home(self, kid: str, *, here: bool) -> str | None:
        """The URL of the replica holding raw kernel *kid*, or None to serve it here.

        Raises KernelLost when the kernel was placed on another replica that is gone (its
        record lapsed). An unknown kernel is served here (404).
        """
        if here or not self.enabled:
            return None
        home = self._placements.get(kid)
        if home is None:
            placement = await self.store.kernel_placement(kid)
            if placement is None:
                return None  # unknown: 404
            home = self._placements[kid] = placement.replica_id
            if len(self._placements) > _REMEMBERED:
                self._placements.pop(next(iter(self._placements)))
        if home == self.replica_id:
            return None  # closed here: 404
        holder = await self._replica(home)
        if holder is not None:
            return holder.url
        if await self.store.kernel_placement(kid) is None:  # deleted before its replica died
            self._placements.pop(kid, None)
            return None
        raise KernelLost(
            f"kernel {kid!r} was lost with the server that ran it; its state is gone: "
            "delete it and create a new one"
        )

    def forget_kernel(self, kid: str) -> None:
        """Drop what routing remembers of kernel *kid* (it was deleted)."""
        self._placements.pop(kid, None)

    def unreachable(self, url: str) -> None:
        """A replica at *url* could not be reached: read its record again next time."""
        for rid, (_, record) in list(self._records.items()):
            if record is not None and record.url == url:
                del self._records[rid]

    async def _replica(self, replica_id: str) -> ReplicaRecord | None:
        """The replica's live record (None when it lapsed), read at most once a heartbeat."""
        now = asyncio.get_running_loop().time()
        known = self._records.get(replica_id)
        if known is not None and now - known[0] < self.heartbeat_s:
            return known[1]
        record = await self.store.get_replica(replica_id)
        self._records[replica_id] = (now, record)
        return record

    async def place(self) -> str | None:
        """Where new work goes: the URL of the replica chosen, or None for this one.

        Raises CapacityError when every live replica is full or draining (``Retry-After``).
        """
        if not self.enabled:
            return None
        live = [r for r in await self.store.replicas() if not r.draining]
        if not any(r.replica_id == self.replica_id for r in live) and not self.draining:
            live.append(
                ReplicaRecord(
                    replica_id=self.replica_id,
                    url=self.url or "",
                    load=max(0, self._load()),
                    capacity=self.capacity,
                    draining=False,
                    heartbeat_at=0.0,
                    expires_at=0.0,
                )
            )
        # this replica's own load is known exactly, not from its last heartbeat
        live = [
            dataclasses.replace(r, load=max(0, self._load()))
            if r.replica_id == self.replica_id
            else r
            for r in live
        ]
        room = [r for r in live if r.load < r.capacity]
        if not room:
            raise CapacityError(
                "every replica of the cluster runs as many sessions and kernels as it may; "
                "retry shortly"
            )
        sample = self._rng.sample(room, min(self.config.placement_sample, len(room)))
        best = min(sample, key=lambda r: (r.load / max(1, r.capacity), r.load))
        return None if best.replica_id == self.replica_id else best.url
