"""A host process's pool of relay threads: daemon threads that copy a tunnel's bytes blocking.

A CONNECT tunnel relays fastest with one blocking thread per direction: the thread sleeps in
``recv`` and the socket wakes it directly, with no event loop turn per chunk
(benchmarks/egress.py measures it against the loop's own relaying, and against socat). The
threads are kept for reuse (a new thread costs about 0.15 ms here) and leave after
:data:`IDLE_S` with no work.

:func:`start` runs a tunnel's relays only when threads for *all* of them are free, at most
:data:`MAX_THREADS` in one process and at most a :class:`Share`'s limit for one owner (a
proxy, so one kernel cannot take every thread); otherwise it runs none and the caller relays
on its event loop instead. The threads are daemons: a tunnel still open when the interpreter
exits never holds up the exit. A child made by ``fork()`` starts with an empty pool of its own.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["IDLE_S", "MAX_THREADS", "PER_SHARE", "Share", "busy", "start"]

log = logging.getLogger(__name__)

MAX_THREADS = 128
"""Relay threads busy at once in one host process (two per tunnel): 64 tunnels."""
PER_SHARE = 16
"""Relay threads one :class:`Share` (one proxy: one kernel) may hold at once: 8 tunnels."""
IDLE_S = 30.0
"""Seconds an idle relay thread waits for work before it leaves."""


class Share:
    """One owner's part of the pool: at most ``limit`` of its jobs run at once.

    A job counts against its share from :func:`start` until it returns (or raises).
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = PER_SHARE if limit is None else limit
        self.busy = 0  # guarded by the pool's lock


_Job = tuple[Callable[[], object], "Future[None]", Share | None]


class _Pool:
    """The threads of one process; every count is guarded by ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.busy = 0
        self.idle = 0

    def start(
        self, work: list[Callable[[], object]], share: Share | None
    ) -> list[Future[None]] | None:
        with self.lock:
            if self.busy + len(work) > MAX_THREADS:
                return None
            if share is not None and share.busy + len(work) > share.limit:
                return None
            taken = min(self.idle, len(work))  # idle threads take these jobs; new ones the rest
            made = 0
            try:
                for _ in range(len(work) - taken):
                    threading.Thread(target=self.serve, name="sunroom-relay", daemon=True).start()
                    made += 1
            except RuntimeError:  # the system has no thread to give (memory, a pids limit)
                self.idle += made  # they wait for work like any idle thread
                log.warning("a relay thread could not be started; relaying on the loop instead")
                return None
            self.idle -= taken
            if share is not None:
                share.busy += len(work)
            self.busy += len(work)
            futures: list[Future[None]] = []
            for job in work:
                future: Future[None] = Future()
                futures.append(future)
                self.jobs.put((job, future, share))
        return futures

    def serve(self) -> None:
        while True:
            try:
                job, future, share = self.jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self.lock:
                    if self.jobs.empty():  # nothing was handed to this thread meanwhile
                        self.idle -= 1
                        return
                continue
            failure: BaseException | None = None
            running = future.set_running_or_notify_cancel()
            if running:
                try:
                    job()
                except BaseException as exc:  # the job's outcome is its future's, on purpose
                    failure = exc
            with self.lock:  # free before the future says so: its waiter may count at once
                self.busy -= 1
                self.idle += 1
                if share is not None:
                    share.busy -= 1
            if running:
                if failure is None:
                    future.set_result(None)
                else:
                    future.set_exception(failure)
                del failure  # no cycle through the traceback


_pool = _Pool()


def _forget_after_fork() -> None:
    """In a forked child: no thread of the parent's pool is here, nor one holding its lock."""
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_forget_after_fork)


def start(
    work: list[Callable[[], object]], share: Share | None = None
) -> list[Future[None]] | None:
    """Run each of ``work`` on its own relay thread at once, or none of them.

    Returns one future per callable (its result None, or the exception it raised), or None when
    fewer than ``len(work)`` threads are free in the process or in ``share``, or the system
    cannot start one (logged): the caller must relay another way.
    """
    return _pool.start(work, share)


def busy() -> int:
    """Relay threads of this process that have work now."""
    with _pool.lock:
        return _pool.busy
