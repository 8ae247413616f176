"""The crash suite (issue 11): ``kill -9`` of ``sunroom serve`` at seeded random moments.

Several sessions run at once on a real ``sunroom serve`` subprocess with the scripted model
(:func:`script`): three cells of every four call the side-effecting host function ``charge``
(``tests.service.hostfns``: one line per call in a ledger file), the fourth ``submit`` s a value
(and charges after it). Meanwhile a thread posts user messages to random sessions at random
moments, and the test ``kill -9`` s the server after random delays; after each kill a new
server starts on the same database and resumes the sessions. The schedule comes from one seed
(``SUNROOM_CRASH_SEED``, else random), printed in every failure message: the same seed gives the
same delays, messages and targets (the interleaving with the server still varies).

At the end :func:`violations` checks the log, the call records and the ledger:

- every session is terminal (``finished`` with a ``success`` result: in this script every run
  ends by ``submit`` or by a text answer, so any other end is a bug);
- every side effect happened once (a ledger key once, a charged amount once per session), has
  its call record, and every call record has exactly one outcome (``ok``, or ``unknown`` with
  one ``CallOutcomeUnknown`` event, named to the model with the next message it got) that
  agrees with the ledger;
- every message answered 202 is recorded exactly once (``MessageReceived``), reached the model
  exactly once (the transcript) and was taken in and answered by a run; a message whose request never connected is not recorded, one whose
  answer was lost in a kill at most once; nothing else is recorded;
- an accepted ``submit`` is its run's output, and the model was not called again in that run;
  no submitted value is accepted twice;
- each session's event seqs are 1..n.

The fast tier (5 kills) runs in the default suite, on a SQLite file and on a real PostgreSQL
database; the slow tier (30 kills) is marked slow.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sunroom.providers import Message, UserMessage
from sunroom.service.codec import message_to_json
from sunroom.service.config import ServiceConfig
from sunroom.service.recovery import replay
from sunroom.store import (
    CallOutcome,
    CallRecord,
    SessionRecord,
    StoredEvent,
    idempotency_key,
)

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "crash-suite-token-0123456789"
SEED_ENV = "SUNROOM_CRASH_SEED"
SESSIONS = 3
SCRIPT_TURNS = 400
SUBMIT_EVERY = 4


def script() -> dict[str, Any]:
    """The scripted model's replies: turn *t* charges *t*; every fourth turn submits ``s<t>``.

    A turn's reply depends only on the number of assistant messages before it, so a cell that
    ran is never asked for again unless the transcript lost its reply (a re-run charges the same
    amount twice, which :func:`violations` reports).
    """
    replies: list[Any] = []
    for t in range(SCRIPT_TURNS):
        if t % SUBMIT_EVERY == SUBMIT_EVERY - 1:
            code = f"submit('s{t}')\nprint(charge({t}))\nimport time\ntime.sleep(0.1)"
        else:
            code = f"print(charge({t}))\nimport time\ntime.sleep(0.05)"
        replies.append({"code": code})
    return {"replies": [*replies, "done"], "delay_s": 0.05}


# -- the service, as a subprocess -----------------------------------------------------------

_started: list[Server] = []


@pytest.fixture(autouse=True)
def _no_leftover_servers() -> Iterator[None]:
    """Stop every server a test started, even when the test fails half-way."""
    yield
    while _started:
        _started.pop().stop()


class Server:
    """One ``sunroom serve`` incarnation on *tmp*'s database; its output goes to files.

    Raises AssertionError when it does not print its URL or become healthy within 30 s.
    """

    def __init__(self, tmp: Path, env: dict[str, str], n: int, *, db: str) -> None:
        self.out = tmp / f"server-{n}.out"
        self.err = tmp / f"server-{n}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0",
                 "--db", db, "--backend", "subprocess",
                 "--functions", "tests.service.hostfns:charge", "--lease-s", "2"],
                cwd=ROOT, env=env, stdout=out, stderr=err,
            )  # fmt: skip
        _started.append(self)
        deadline = time.monotonic() + 30
        while "listening on" not in (text := self.out.read_text()):
            assert self.proc.poll() is None, f"server {n} exited: {self.err.read_text()}"
            assert time.monotonic() < deadline, f"server {n} printed no URL: {text}"
            time.sleep(0.02)
        line = next(x for x in text.splitlines() if "listening on" in x)
        self.url = line.rsplit(" ", 1)[-1].strip()
        with httpx.Client(base_url=self.url, timeout=5) as client:
            while True:
                try:
                    if client.get("/healthz").json()["ok"]:
                        return
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"server {n} did not become healthy"
                time.sleep(0.02)

    def client(self, timeout: float = 10) -> httpx.Client:
        """A new client for this server (the caller closes it)."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout
        )

    def kill(self) -> None:
        """``kill -9``; AssertionError if it had already exited on its own."""
        rc = self.proc.poll()
        assert rc is None, f"the server exited by itself ({rc}): {self.err.read_text()[-2000:]}"
        _started.remove(self)
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM, wait (then SIGKILL); idempotent."""
        if self in _started:
            _started.remove(self)
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- what happened ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Post:
    """One ``POST /sessions/ID/messages`` and how it ended.

    ``status`` is the HTTP status, or None: ``unsent`` when the connection was refused (the
    server was down: nothing can have been recorded), else the answer was lost (a kill while
    it was in flight: it may have been recorded).
    """

    sid: str
    text: str
    status: int | None
    unsent: bool = False
    detail: str = ""


@dataclass(slots=True)
class SessionLog:
    """Everything the store holds about one session."""

    record: SessionRecord | None
    events: list[StoredEvent]
    calls: list[CallRecord]


@dataclass(slots=True)
class Observed:
    """The end state of a run of the suite: the store, the ledger and what the test sent.

    Attributes:
        sessions: session id -> its log.
        ledger: ``(idempotency key, amount)`` per side effect, in the order they happened.
        tasks: session id -> the task it was created with (accepted with 201).
        posts: every message the test posted.
    """

    sessions: dict[str, SessionLog]
    ledger: list[tuple[str, int]]
    tasks: dict[str, str]
    posts: list[Post] = field(default_factory=list)


def violations(seen: Observed) -> list[str]:
    """Every way *seen* breaks the suite's contract (see the module docstring); [] if none."""
    out: list[str] = []
    for sid, log in seen.sessions.items():
        out += _session_violations(sid, log)
    out += _ledger_violations(seen)
    out += _message_violations(seen)
    return out


def _session_violations(sid: str, log: SessionLog) -> list[str]:
    out: list[str] = []
    s = sid[:8]
    seqs = [e.seq for e in log.events]
    if seqs != list(range(1, len(seqs) + 1)):
        out.append(f"{s}: event seqs are not 1..{len(seqs)}: {_gaps(seqs)}")
    record = log.record
    if record is None:
        return [*out, f"{s}: no session record"]
    result = record.result or {}
    if record.status != "finished" or result.get("status") != "success":
        out.append(f"{s}: not terminal with success: {record.status} {json.dumps(result)[:300]}")
    state = replay(log.events)
    if state.run_open:
        out.append(f"{s}: the log ends with a run open")
    ended = [e for e in log.events if e.kind == "SessionEnded"]
    if ended and ended[-1].payload["result"].get("output") != result.get("output"):
        out.append(f"{s}: the record's output is not the last run's")
    # runs: the events between two SessionEnded
    submitted: Counter[Any] = Counter()
    run_submit: list[Any] = []
    model_after_submit = False
    for e in log.events:
        if e.kind == "SubmitAccepted":
            submitted[json.dumps(e.payload.get("output"))] += 1
            run_submit.append(e.payload.get("output"))
        elif e.kind == "CodeSubmitted" and run_submit:
            model_after_submit = True
        elif e.kind == "SessionEnded":
            r = e.payload["result"]
            if r.get("status") != "success":
                out.append(f"{s}: run ended at seq {e.seq} with {json.dumps(r)[:300]}")
            if len(run_submit) > 1:
                out.append(f"{s}: run ending at seq {e.seq} accepted {len(run_submit)} submits")
            if run_submit and r.get("output") != run_submit[0]:
                out.append(
                    f"{s}: run ending at seq {e.seq} output {r.get('output')!r}, "
                    f"its accepted submit {run_submit[0]!r}"
                )
            if model_after_submit:
                out.append(f"{s}: run ending at seq {e.seq} ran a cell after its submit")
            run_submit, model_after_submit = [], False
    out += [f"{s}: submit {v} accepted {n} times" for v, n in submitted.items() if n > 1]
    unknown_events = Counter(
        str(e.payload["call_id"]) for e in log.events if e.kind == "CallOutcomeUnknown"
    )
    for c in log.calls:
        if c.outcome not in ("ok", "unknown"):
            out.append(f"{s}: call {c.call_id} has outcome {c.outcome!r} ({c.result})")
        want = 1 if c.outcome == "unknown" else 0
        if unknown_events[c.call_id] != want:
            out.append(
                f"{s}: call {c.call_id} ({c.outcome}) has {unknown_events[c.call_id]} "
                "CallOutcomeUnknown events"
            )
    out += _untold(s, log, state.transcript)
    if len({c.call_id for c in log.calls}) != len(log.calls):
        out.append(f"{s}: duplicated call ids")
    return out


def _untold(s: str, log: SessionLog, transcript: list[Message]) -> list[str]:
    """Unknown calls the model got a message after their report without being told of.

    The note naming them goes with the first user message after the resume that reported
    them (an idle session holds it until its next message), so a call is untold only when a
    user message reached the transcript after its ``CallOutcomeUnknown`` and the transcript
    never names it.
    """
    out: list[str] = []
    told = json.dumps([message_to_json(m) for m in transcript])
    reported = {
        str(e.payload["call_id"]): e.seq for e in log.events if e.kind == "CallOutcomeUnknown"
    }
    users_at = [
        e.seq
        for e in log.events
        if e.kind == "Transcript" and any(m.get("role") == "user" for m in e.payload["messages"])
    ]
    for c in log.calls:
        if c.outcome != "unknown" or f"(call {c.call_id}) was running" in told:
            continue
        if any(seq > reported.get(c.call_id, 0) for seq in users_at):
            out.append(f"{s}: the model was never told that call {c.call_id} is unknown")
    return out


def _gaps(seqs: list[int]) -> str:
    bad = [(i + 1, q) for i, q in enumerate(seqs) if q != i + 1]
    return f"first mismatch at position {bad[0][0]}: seq {bad[0][1]}" if bad else ""


def _ledger_violations(seen: Observed) -> list[str]:
    out: list[str] = []
    calls = {c.idempotency_key: c for log in seen.sessions.values() for c in log.calls}
    keys = Counter(k for k, _ in seen.ledger)
    out += [f"side effect {k} happened {n} times" for k, n in keys.items() if n > 1]
    amounts: Counter[tuple[str, int]] = Counter()
    for key, amount in seen.ledger:
        c = calls.get(key)
        if c is None:
            out.append(f"side effect {key} ({amount}) has no call record")
            continue
        amounts[(c.session_id, amount)] += 1
        if c.args.get("amount") != amount:
            out.append(f"side effect {key} charged {amount}, its record says {c.args}")
    out += [
        f"{sid[:8]}: charge({a}) happened {n} times" for (sid, a), n in amounts.items() if n > 1
    ]
    for key, c in calls.items():
        if c.outcome == "ok" and keys[key] != 1:
            out.append(f"{c.session_id[:8]}: call {c.call_id} is ok, its side effect happened "
                       f"{keys[key]} times")  # fmt: skip
    return out


def _message_violations(seen: Observed) -> list[str]:
    out: list[str] = []
    received: dict[str, Counter[str]] = {}
    for sid, log in seen.sessions.items():
        received[sid] = Counter(
            str(e.payload["text"]) for e in log.events if e.kind == "MessageReceived"
        )
        state = replay(log.events)
        users = [m.text for m in state.transcript if isinstance(m, UserMessage)]
        for m in state.messages:
            if not (m.taken and m.answered):
                out.append(f"{sid[:8]}: message {m.text!r} taken={m.taken} answered={m.answered}")
            told = sum(u.count(m.text) for u in users)
            if told != 1:
                out.append(f"{sid[:8]}: message {m.text!r} reached the model {told} times")
    expected: dict[tuple[str, str], tuple[int, int]] = {}  # (sid, text) -> (min, max) records
    for sid, task in seen.tasks.items():
        expected[(sid, task)] = (1, 1)
    for p in seen.posts:
        if p.status == 202:
            expected[(p.sid, p.text)] = (1, 1)
        elif p.status is None and not p.unsent:
            expected[(p.sid, p.text)] = (0, 1)
        else:
            expected[(p.sid, p.text)] = (0, 0)
    for (sid, text), (low, high) in expected.items():
        n = received.get(sid, Counter())[text]
        if not low <= n <= high:
            out.append(f"{sid[:8]}: message {text!r} recorded {n} times, expected {low}..{high}")
    for sid, texts in received.items():
        for text in texts:
            if (sid, text) not in expected:
                out.append(f"{sid[:8]}: message {text!r} recorded but never sent")
    return out


# -- the run -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Figures:
    """What a run did (for the report and the docs)."""

    seed: int
    kills: int
    sessions: int
    charges: int = 0
    unknown_calls: int = 0
    accepted: int = 0
    lost_answers: int = 0
    unsent: int = 0
    refused: int = 0
    submits: int = 0
    runs: int = 0
    events: int = 0
    wall_s: float = 0.0


class Poster(threading.Thread):
    """Posts a message to a random session at random intervals, to whichever server is up."""

    def __init__(self, rng: random.Random, sids: list[str]) -> None:
        super().__init__(name="crash-suite-poster", daemon=True)
        self.rng = rng
        self.sids = sids
        self.server: Server | None = None
        self.posts: list[Post] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self.halt.wait(self.rng.uniform(0.05, 0.5)):
                server = self.server
                if server is None:
                    continue
                sid = self.rng.choice(self.sids)
                text = f"message {n}."  # no text is part of another
                n += 1
                self.posts.append(self._post(server, sid, text))
        except BaseException as exc:  # reported by the test, never swallowed
            self.error = exc

    def _post(self, server: Server, sid: str, text: str) -> Post:
        with server.client() as client:
            try:
                r = client.post(f"/sessions/{sid}/messages", json={"text": text})
            except httpx.ConnectError as exc:
                return Post(sid, text, None, unsent=True, detail=str(exc))
            except httpx.TransportError as exc:
                return Post(sid, text, None, detail=f"{type(exc).__name__}: {exc}")
        return Post(sid, text, r.status_code, detail="" if r.status_code == 202 else r.text)


def _read(db: str, sids: list[str]) -> dict[str, SessionLog]:
    async def go() -> dict[str, SessionLog]:
        async with ServiceConfig(db=db).new_store() as store:  # type: ignore[call-arg]
            return {
                sid: SessionLog(await store.get_session(sid), await store.events(sid),
                                await store.calls(sid))
                for sid in sids
            }  # fmt: skip

    return asyncio.run(go())


def _unsettled(server: Server, db: str, sids: list[str]) -> list[str]:
    """The sessions whose record says ``running`` or whose log has a run open or a message
    left, each with its record, its state and its last events; [] when all settled."""
    with server.client() as client:
        status = {sid: client.get(f"/sessions/{sid}").json()["status"] for sid in sids}
    out: list[str] = []
    for sid, log in _read(db, sids).items():
        state = replay(log.events)
        if status[sid] != "running" and not state.run_open and not state.pending:
            continue
        r = log.record
        record = "no record" if r is None else (
            f"record {r.status} (served {status[sid]}) owner={r.owner} "
            f"lease_expires_at={r.lease_expires_at} finished_at={r.finished_at}"
        )  # fmt: skip
        tail = "\n".join(
            f"    {e.seq} {e.ts:.2f} {e.kind} {json.dumps(e.payload)[:160]}"
            for e in log.events[-8:]
        )
        pending = [m.text for m in state.pending]
        ended = [(e.seq, round(e.ts, 2)) for e in log.events if e.kind == "SessionEnded"][-1:]
        out.append(
            f"{sid[:8]}: {record}; run_open={state.run_open} pending={pending} "
            f"last SessionEnded (seq, ts)={ended}\n{tail}"
        )
    return out


def _diagnosis(tmp: Path, unsettled: list[str]) -> str:
    """What a failed settle shows: the unsettled sessions, every server's stderr tail."""
    parts = ["unsettled sessions:", *unsettled]
    for err in sorted(tmp.glob("server-*.err"), key=lambda p: int(p.stem.split("-")[1])):
        text = err.read_text(errors="replace")[-1500:]
        parts.append(
            f"-- {err.name} (last 1500 chars):\n{text}" if text else f"-- {err.name}: empty"
        )
    return "\n".join(parts)


def run_suite(tmp: Path, *, kills: int, seed: int, db: str) -> tuple[Observed, Figures]:
    """Run sessions, post messages and kill the server *kills* times (see the module).

    *db* is the store: a SQLite path or a ``postgresql://`` URL.
    """
    began = time.monotonic()
    rng = random.Random(seed)
    (tmp / "script.json").write_text(json.dumps(script()))
    ledger = tmp / "ledger.txt"
    env = {**os.environ, "SUNROOM_TOKEN": TOKEN,
           "SUNROOM_MODEL": f"scripted:{tmp / 'script.json'}",
           "SUNROOM_TEST_LEDGER": str(ledger)}  # fmt: skip
    server = Server(tmp, env, 0, db=db)
    tasks: dict[str, str] = {}
    with server.client() as client:
        for i in range(SESSIONS):
            r = client.post("/sessions", json={"task": f"task {i}."})
            assert r.status_code == 201, r.text
            tasks[r.json()["session_id"]] = f"task {i}."
    sids = list(tasks)
    poster = Poster(random.Random(rng.getrandbits(64)), sids)
    poster.server = server
    poster.start()
    try:
        for k in range(kills):
            time.sleep(rng.uniform(0.2, 1.6))
            server.kill()
            server = Server(tmp, env, k + 1, db=db)
            poster.server = server
        # under heavy load a server may be up too briefly for any post to be answered; the
        # last one is not killed, so posting on to it gets a message accepted (the suite is
        # about messages as well as kills)
        until = time.monotonic() + 30
        while not any(p.status == 202 for p in poster.posts) and time.monotonic() < until:
            time.sleep(0.05)
    finally:
        poster.halt.set()
        poster.join(30)
    assert poster.error is None, f"the poster failed: {poster.error!r}"
    deadline = time.monotonic() + 90
    while unsettled := _unsettled(server, db, sids):
        assert time.monotonic() < deadline, (
            f"seed {seed}: the sessions did not settle in 90 s (files in {tmp})\n"
            + _diagnosis(tmp, unsettled)
        )
        time.sleep(0.1)
    server.stop()
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    seen = Observed(
        sessions=_read(db, sids),
        ledger=[(k, int(a)) for k, a in (line.split() for line in lines)],
        tasks=tasks,
        posts=list(poster.posts),
    )
    figures = Figures(seed=seed, kills=kills, sessions=SESSIONS, charges=len(seen.ledger))
    for log in seen.sessions.values():
        figures.unknown_calls += sum(c.outcome == "unknown" for c in log.calls)
        figures.submits += sum(e.kind == "SubmitAccepted" for e in log.events)
        figures.runs += sum(e.kind == "SessionEnded" for e in log.events)
        figures.events += len(log.events)
    figures.accepted = sum(p.status == 202 for p in seen.posts) + len(tasks)
    figures.lost_answers = sum(p.status is None and not p.unsent for p in seen.posts)
    figures.unsent = sum(p.unsent for p in seen.posts)
    figures.refused = sum(p.status not in (None, 202) for p in seen.posts)
    figures.wall_s = round(time.monotonic() - began, 1)
    return seen, figures


def _seed() -> int:
    value = os.environ.get(SEED_ENV)
    return int(value) if value else random.SystemRandom().randrange(2**32)


def _crash_suite(tmp: Path, kills: int, db: str) -> None:
    seed = _seed()
    shared = tempfile.gettempdir()
    mode = stat.S_IMODE(os.stat(shared).st_mode)
    try:
        seen, figures = run_suite(tmp, kills=kills, seed=seed, db=db)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n(reproduce with {SEED_ENV}={seed})") from exc
    # the sweeps of the killed servers' run directories leave the shared directory as it was
    after = stat.S_IMODE(os.stat(shared).st_mode)
    assert after == mode, f"{SEED_ENV}={seed}: {shared} went from {mode:o} to {after:o}"
    print(figures)
    print(Counter((p.status, p.detail[:80]) for p in seen.posts if p.status not in (None, 202)))
    problems = violations(seen)
    assert not problems, f"{SEED_ENV}={seed}: {len(problems)} violations:\n" + "\n".join(
        problems[:40]
    )
    assert figures.accepted > len(seen.tasks), f"{SEED_ENV}={seed}: no message was accepted"
    assert figures.charges > 0 and figures.submits > 0, f"{SEED_ENV}={seed}: {figures}"


@pytest.fixture(params=["sqlite", "postgres"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store the servers share: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "s.db")
    dsn: str = request.getfixturevalue("postgres_db_dsn")
    return dsn


def test_crash_suite_fast_tier(tmp_path: Path, store_spec: str) -> None:
    _crash_suite(tmp_path, kills=5, db=store_spec)


@pytest.mark.slow
def test_crash_suite_slow_tier(tmp_path: Path) -> None:
    _crash_suite(tmp_path, kills=30, db=str(tmp_path / "s.db"))  # the fast tier covers PostgreSQL


# -- the checks can fail ---------------------------------------------------------------------

NOTE = (
    "[The service restarted] ...\n- charge(amount=4) (call 2) was running: its outcome is UNKNOWN"
)


def _steps() -> list[tuple[str, dict[str, Any]]]:
    """A consistent log: a run that submits, a run cut off by a kill (call 2 unknown)."""

    def transcript(start: int, text: str, taken: list[str]) -> dict[str, Any]:
        return {"start": start, "messages": [message_to_json(UserMessage(text))], "taken": taken}

    return [
        ("MessageReceived", {"id": "m1", "text": "task 0"}),
        ("Transcript", transcript(0, "task 0", ["m1"])),
        ("CodeSubmitted", {"code": "submit('s3')"}),
        ("SubmitAccepted", {"output": "s3"}),
        ("SessionEnded", {"result": {"status": "success", "output": "s3"}}),
        ("MessageReceived", {"id": "m2", "text": "message 0"}),
        ("Transcript", transcript(1, "message 0", ["m2"])),
        ("CallOutcomeUnknown", {"call_id": "2"}),
        ("KernelRestarted", {}),
        ("Transcript", transcript(2, NOTE, [])),
        ("SessionEnded", {"result": {"status": "success", "output": "done"}}),
    ]


def _observed(steps: list[tuple[str, dict[str, Any]]]) -> Observed:
    events = [
        StoredEvent(session_id="a", seq=i, kind=k, payload=p, ts=0.0)
        for i, (k, p) in enumerate(steps, 1)
    ]
    record = SessionRecord(
        session_id="a", status="finished", config={},
        result={"status": "success", "output": "done"}, created_at=0, updated_at=0,
        finished_at=0, owner=None, lease_expires_at=None,
    )  # fmt: skip

    def call(call_id: str, amount: int, outcome: CallOutcome | None) -> CallRecord:
        return CallRecord(session_id="a", call_id=call_id, name="charge",
                          args={"amount": amount}, side_effect=True, started_at=0,
                          started_by="x", outcome=outcome, result=None, finished_at=None)  # fmt: skip

    return Observed(
        sessions={"a": SessionLog(record, events, [call("1", 3, "ok"), call("2", 4, "unknown")])},
        ledger=[(idempotency_key("a", "1"), 3)],
        tasks={"a": "task 0"},
        posts=[
            Post("a", "message 0", 202),
            Post("a", "message 1", None, unsent=True),
            Post("a", "message 2", None),
            Post("a", "message 3", 503),
        ],
    )


def _insert(at: int, kind: str, payload: dict[str, Any]) -> Any:
    def doctor(steps: list[tuple[str, dict[str, Any]]]) -> None:
        steps.insert(at, (kind, payload))

    return doctor


def _drop(kind: str, nth: int = -1) -> Any:
    def doctor(steps: list[tuple[str, dict[str, Any]]]) -> None:
        where = [i for i, (k, _) in enumerate(steps) if k == kind]
        del steps[where[nth]]

    return doctor


def _retell(text: str) -> Any:
    def doctor(steps: list[tuple[str, dict[str, Any]]]) -> None:
        i = max(i for i, (k, _) in enumerate(steps) if k == "Transcript")
        steps[i] = ("Transcript", {"start": 2, "messages": [message_to_json(UserMessage(text))]})

    return doctor


def _edit(seen: Observed, **changes: Any) -> None:
    log = seen.sessions["a"]
    if "record" in changes:
        assert log.record is not None
        log.record = dataclasses.replace(log.record, **changes["record"])
    if "calls" in changes:
        log.calls = [
            dataclasses.replace(c, **changes["calls"].get(c.call_id, {})) for c in log.calls
        ]
    if "ledger" in changes:
        seen.ledger = changes["ledger"]
    if "posts" in changes:
        seen.posts += changes["posts"]
    if "seq" in changes:
        log.events[-1] = dataclasses.replace(log.events[-1], seq=changes["seq"])


KEY1 = idempotency_key("a", "1")
DOCTORED: list[tuple[str, Any, dict[str, Any], str]] = [
    # (id, a change to the steps, a change to the rest, the violation expected)
    ("effect-twice", None, {"ledger": [(KEY1, 3), (KEY1, 3)]}, "happened 2 times"),
    ("effect-without-record", None, {"ledger": [(KEY1, 3), ("k", 9)]}, "has no call record"),
    ("ok-without-effect", None, {"ledger": []}, "its side effect happened 0 times"),
    ("cell-re-run", None, {"ledger": [(KEY1, 3), (idempotency_key("a", "2"), 3)]},
     "charge(3) happened 2 times"),
    ("no-outcome", None, {"calls": {"2": {"outcome": None}}}, "has outcome None"),
    ("unknown-unreported", _drop("CallOutcomeUnknown"), {}, "0 CallOutcomeUnknown events"),
    ("model-not-told", _retell("a note"), {}, "never told that call 2"),
    ("seq-gap", None, {"seq": 13}, "event seqs are not"),
    ("message-twice", _insert(7, "MessageReceived", {"id": "m3", "text": "message 0"}), {},
     "'message 0' recorded 2 times"),
    ("message-told-twice", _insert(10, "Transcript", {"start": 3, "messages": [
        message_to_json(UserMessage("again: message 0"))]}), {}, "reached the model 2 times"),
    ("message-lost", None, {"posts": [Post("a", "message 4", 202)]}, "'message 4' recorded 0"),
    ("unsent-recorded", _insert(7, "MessageReceived", {"id": "m3", "text": "message 1"}), {},
     "'message 1' recorded 1 times, expected 0..0"),
    ("refused-recorded", _insert(7, "MessageReceived", {"id": "m3", "text": "message 3"}), {},
     "'message 3' recorded 1 times, expected 0..0"),
    ("never-sent", _insert(7, "MessageReceived", {"id": "m3", "text": "who?"}), {},
     "never sent"),
    ("unanswered", _drop("SessionEnded"), {}, "answered=False"),
    ("not-terminal", None, {"record": {"status": "running", "result": None}}, "not terminal"),
    ("failed-run", None, {"record": {"status": "failed", "result": {"status": "max_turns"}}},
     "not terminal with success"),
    ("submit-not-output", _insert(4, "SubmitAccepted", {"output": "s7"}), {},
     "accepted 2 submits"),
    ("submit-redone", _insert(9, "SubmitAccepted", {"output": "s3"}), {},
     "submit \"s3\" accepted 2 times"),
    ("model-after-submit", _insert(4, "CodeSubmitted", {"code": "x"}), {},
     "ran a cell after its submit"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("steps_change", "change", "expected"),
    [pytest.param(s, c, e, id=i) for i, s, c, e in DOCTORED],
)
def test_each_check_trips_on_a_doctored_end_state(
    steps_change: Any, change: dict[str, Any], expected: str
) -> None:
    assert violations(_observed(_steps())) == []
    steps = _steps()
    if steps_change is not None:
        steps_change(steps)
    seen = _observed(steps)
    _edit(seen, **change)
    found = violations(seen)
    assert any(expected in v for v in found), found
