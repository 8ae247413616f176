"""The relay threads: all of a tunnel's relays or none, reuse, the cap, outcomes, idle exit, fork."""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from pathlib import Path

import pytest

from sunroom.network import relay_threads


def _relay_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sunroom-relay"]


def _wait_until(condition: object, timeout_s: float = 10.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        time.sleep(0.01)


def test_work_runs_on_daemon_threads_and_the_threads_are_reused() -> None:
    seen: list[threading.Thread] = []
    futures = relay_threads.start([lambda: seen.append(threading.current_thread())] * 2)
    assert futures is not None
    for future in futures:
        assert future.result(10) is None
    assert all(t.daemon and t.name == "sunroom-relay" for t in seen)
    _wait_until(lambda: relay_threads.busy() == 0)
    again: list[threading.Thread] = []
    futures = relay_threads.start([lambda: again.append(threading.current_thread())])
    assert futures is not None
    futures[0].result(10)
    assert again[0] in _relay_threads()  # an idle thread took it (no new one per job)


def test_all_or_none_within_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_threads, "MAX_THREADS", 3)
    release = threading.Event()
    held = relay_threads.start([release.wait, release.wait])
    assert held is not None
    try:
        assert relay_threads.busy() == 2
        assert relay_threads.start([release.wait, release.wait]) is None  # 4 > 3: none start
        assert relay_threads.busy() == 2
        one = relay_threads.start([release.wait])
        assert one is not None
        held += one
    finally:
        release.set()
    for future in held:
        future.result(10)
    _wait_until(lambda: relay_threads.busy() == 0)
    assert relay_threads.start([lambda: None] * 3) is not None  # the threads are free again


def test_a_share_caps_one_owner_and_leaves_the_rest_to_others() -> None:
    release = threading.Event()
    share = relay_threads.Share(limit=2)
    assert relay_threads.Share().limit == relay_threads.PER_SHARE
    held = relay_threads.start([release.wait, release.wait], share)
    assert held is not None
    try:
        assert relay_threads.start([release.wait], share) is None  # the owner's 2 are busy
        other = relay_threads.start([release.wait], relay_threads.Share(limit=2))
        assert other is not None  # another owner still gets a thread
        held += other
    finally:
        release.set()
    for future in held:
        future.result(10)
    _wait_until(lambda: share.busy == 0)
    again = relay_threads.start([lambda: None, lambda: None], share)
    assert again is not None


def test_an_exception_is_the_futures_and_the_thread_goes_on() -> None:
    def fails() -> None:
        raise OSError("reset")

    futures = relay_threads.start([fails])
    assert futures is not None
    with pytest.raises(OSError, match="reset"):
        futures[0].result(10)
    _wait_until(lambda: relay_threads.busy() == 0)
    futures = relay_threads.start([lambda: None])
    assert futures is not None
    assert futures[0].result(10) is None


def _in_a_child(check: object) -> None:
    """Run ``check`` in a forked child (a fresh pool, no relay threads); it must return."""
    assert callable(check)
    pid = os.fork()
    if pid == 0:
        try:
            check()
            code = 0
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_idle_threads_leave() -> None:
    def check() -> None:
        relay_threads.IDLE_S = 0.2
        assert not _relay_threads()
        futures = relay_threads.start([lambda: None] * 4)
        assert futures is not None
        for future in futures:
            future.result(10)
        assert _relay_threads()
        _wait_until(lambda: not _relay_threads())
        futures = relay_threads.start([lambda: None])  # and new ones come when work does
        assert futures is not None
        assert futures[0].result(10) is None

    _in_a_child(check)


def _a_fresh_pool() -> None:
    """The pool (a forked child's) has no busy thread and runs new work."""
    assert relay_threads.busy() == 0
    futures = relay_threads.start([lambda: None])
    assert futures is not None
    assert futures[0].result(10) is None


def test_a_forked_process_has_a_pool_of_its_own() -> None:
    release = threading.Event()
    held = relay_threads.start([release.wait])  # the parent's pool has a busy thread
    assert held is not None

    try:
        _in_a_child(_a_fresh_pool)  # no thread of the parent's pool survived the fork
    finally:
        release.set()
    held[0].result(10)


def test_when_the_system_gives_no_thread_none_start_and_the_counts_stay_right() -> None:
    """A thread that cannot be made (here: no memory for its stack) is not a free thread: the
    tunnel relays on its loop instead, and nothing is counted busy for it."""

    def check() -> None:
        size = next(
            int(line.split()[1]) * 1024
            for line in Path("/proc/self/status").read_text().splitlines()
            if line.startswith("VmSize:")
        )
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        threading.stack_size(256 * 1024 * 1024)
        # room for one more thread's stack, not two: the second of the pair cannot start
        resource.setrlimit(resource.RLIMIT_AS, (size + 320 * 1024 * 1024, hard))
        share = relay_threads.Share()
        ran: list[int] = []
        assert relay_threads.start([lambda: ran.append(1)] * 2, share) is None
        assert relay_threads.busy() == 0 and share.busy == 0 and not ran
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        threading.stack_size(0)
        futures = relay_threads.start([lambda: ran.append(1)] * 2, share)
        assert futures is not None
        for future in futures:
            assert future.result(10) is None
        assert ran == [1, 1]
        _wait_until(lambda: relay_threads.busy() == 0 and share.busy == 0)

    _in_a_child(check)


def test_a_fork_while_a_thread_is_inside_the_pool_leaves_the_child_a_working_pool() -> None:
    """A thread may be in start() or busy() (holding the pool's lock) when another forks; the
    child has no such thread, so its pool must not wait for that lock."""
    inside, leave = threading.Event(), threading.Event()

    def in_the_pool() -> None:
        with relay_threads._pool.lock:  # as start() or busy() holds it for a moment
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=in_the_pool)
    holder.start()
    inside.wait(10)

    def check() -> None:
        signal.alarm(5)  # a child stuck on the lock is killed: the test fails, never hangs
        _a_fresh_pool()

    try:
        _in_a_child(check)
    finally:
        leave.set()
        holder.join(10)
