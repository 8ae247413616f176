"""Correctness across real processes: the claim race, and ``kill -9`` at awkward moments.

Each test runs on both backends: a SQLite file shared by the processes, or a PostgreSQL
database of the worker's scratch cluster (the processes connect to it; its server is never
killed, only the clients).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pytest

from sunroom.store import open_store
from tests.store.conftest import FakeClock

if TYPE_CHECKING:
    from benchmarks._pg import Cluster

CHILD = Path(__file__).with_name("child.py")


@contextmanager
def child(*args: str) -> Iterator[subprocess.Popen[str]]:
    """A child process running ``child.py ARGS``, killed and reaped on exit."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert readline(proc) == "ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def readline(proc: subprocess.Popen[str]) -> str:
    out: IO[str] | None = proc.stdout
    assert out is not None
    line = out.readline()
    assert line, f"the child exited early (code {proc.poll()})"
    return line.strip()


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL


@pytest.fixture(params=["sqlite", "postgres"])
def spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store the processes share: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_db_dsn"))
    return str(tmp_path / "s.db")


async def test_racing_processes_exactly_one_claims(spec: str) -> None:
    """Three processes race to claim (or take over after a dead owner) 60 sessions."""
    path = spec
    past = FakeClock(time.time() - 3600)  # leases it grants have long expired
    rounds = 60
    async with open_store(path) as setup, open_store(path, clock=past) as dead_owner:
        for i in range(rounds):
            await setup.create_session(f"s{i}", config={})
            if i % 2:  # a crashed owner's session, lease expired: the resume race
                assert await dead_owner.claim(f"s{i}", owner="dead", lease_s=60)
        with ExitStack() as stack:
            procs = {n: stack.enter_context(child("claim", path, n)) for n in "ABC"}
            tally = dict.fromkeys(procs, 0)
            for i in range(rounds):
                for proc in procs.values():
                    assert proc.stdin is not None
                    proc.stdin.write(f"s{i}\n")
                    proc.stdin.flush()
                won = {name: readline(proc) == "1" for name, proc in procs.items()}
                winners = [name for name, w in won.items() if w]
                assert len(winners) == 1, (i, won)
                tally[winners[0]] += 1
                record = await setup.get_session(f"s{i}")
                assert record is not None and record.owner == winners[0]
            print(f"\nclaim race winners over {rounds} rounds: {tally}")


async def test_kill_9_right_after_append_loses_nothing(spec: str) -> None:
    path = spec
    later = FakeClock(time.time() + 3600)  # the killed owner's lease has expired by then
    async with open_store(path) as store:
        await store.create_session("s1", config={}, owner="child-1", lease_s=60)
    acked = 0
    for round_, acks in enumerate((1, 40, 150)):
        with child("append", path, "s1", "child-1") as proc:
            for _ in range(acks):
                acked = int(readline(proc))
            kill9(proc)  # it kept appending meanwhile: the kill lands anywhere
        async with open_store(path) as store:
            last = await store.last_seq("s1")
            assert last >= acked, f"round {round_}: acknowledged {acked}, stored {last}"
            events = await store.events("s1")
            assert [e.seq for e in events] == list(range(1, last + 1))
            assert all(e.payload == {"n": e.seq} for e in events)
            assert last % 3 == 0, "appends are atomic: whole batches only"
    async with open_store(path, clock=later) as resumer:
        assert await resumer.claim("s1", owner="resumer", lease_s=60)


async def test_a_call_cut_short_by_kill_9_is_unfinished_then_unknown(spec: str) -> None:
    path = spec
    async with open_store(path) as store:
        await store.create_session("s1", config={}, owner="child-1", lease_s=60)
        await store.record_call_started(
            "s1", "c0", name="lookup", args={}, side_effect=False, owner="child-1"
        )
        await store.record_call_finished("s1", "c0", outcome="ok", result={}, owner="child-1")
    with child("call", path, "s1", "child-1", "c1") as proc:
        assert readline(proc) == "started"
        kill9(proc)
    async with open_store(path, clock=FakeClock(time.time() + 3600)) as store:
        assert await store.claim("s1", owner="resumer", lease_s=60)
        (unfinished,) = await store.unfinished_calls("s1")
        assert unfinished.call_id == "c1" and unfinished.side_effect
        assert unfinished.name == "charge" and unfinished.args == {"amount": 5}
        assert unfinished.started_by == "child-1"
        marked = await store.mark_unknown("s1", "c1", owner="resumer")
        assert marked.outcome == "unknown"
        assert await store.unfinished_calls("s1") == []
        assert [(c.call_id, c.outcome) for c in await store.calls("s1")] == [
            ("c0", "ok"),
            ("c1", "unknown"),
        ]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_processes_opening_a_fresh_store_at_once_all_succeed(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """Creation and migration of a new store are serialised: every opener gets a working store.

    On PostgreSQL the four processes migrate a fresh database at once, under the advisory lock.
    """
    cluster: Cluster | None = None
    if backend == "postgres":
        cluster = request.getfixturevalue("postgres_cluster")
    for attempt in range(3):
        database = None if cluster is None else cluster.create_database()
        path = (
            str(tmp_path / f"s{attempt}.db")
            if cluster is None or database is None
            else cluster.dsn(database, password=True)
        )
        procs = [
            subprocess.Popen(
                [sys.executable, str(CHILD), "claim", path, f"o{n}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in range(4)
        ]
        try:
            outputs = [proc.communicate(timeout=60)[0] for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:  # pragma: no cover - only on a timeout
                    proc.kill()
                    proc.wait()
            if cluster is not None and database is not None:
                cluster.drop_database(database)
        assert [proc.returncode for proc in procs] == [0] * 4, outputs
        assert outputs == ["ready\n"] * 4
