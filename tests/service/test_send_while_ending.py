"""A message sent while a run is ending: the record stays ``running`` until a run answers it.

Found by the crash suite (``test_crash_suite.py``, "the sessions did not settle"): a message
posted while its session's run was ending read the record ``running`` (no reopen needed),
then the run's ``SessionEnded`` was written and the manager recorded the session ``finished``
(the message was not yet handed to the session, so it was neither running nor a late message),
and only then was the message recorded and the next run started. The record said ``finished``
while that run went on; a ``kill -9`` during it left a log with a run open and a record no
restarted server resumes (only ``running`` records are), so the session never settled.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from sunroom.providers import FunctionModel, Request
from sunroom.service import ServiceConfig, SessionManager
from sunroom.service.recovery import replay
from sunroom.service.schemas import CreateSession
from sunroom.store import NewEvent, SQLiteStore

TOKEN = "test-token-0123456789abcdef"


class Race:
    """A session whose first run's end is written while a message to it is in flight.

    :meth:`setup` creates the session (its model answers the task at once), holds the write of
    the run's ``SessionEnded`` until :meth:`send` has read the record, then lets it through:
    the message starts a second run, whose model call waits for :attr:`release`.
    """

    def __init__(self, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = store
        self.release = asyncio.Event()
        self._second = asyncio.Event()
        self._ended_held = asyncio.Event()
        self._gate = asyncio.Event()
        self._read = asyncio.Event()
        self._append, self._get = store.append, store.get_session
        monkeypatch.setattr(store, "append", self._held_append)
        monkeypatch.setattr(store, "get_session", self._noted_get)

    async def _held_append(
        self, sid: str, events: Any, *, owner: str, generation: int | None = None
    ) -> int:
        if any(e.kind == "SessionEnded" for e in events) and not self._gate.is_set():
            self._ended_held.set()
            await self._gate.wait()
        return await self._append(sid, events, owner=owner, generation=generation)

    async def _noted_get(self, sid: str) -> Any:
        record = await self._get(sid)
        if self._ended_held.is_set():
            self._read.set()
        return record

    async def reply(self, request: Request) -> str:
        if self._second.is_set():
            await self.release.wait()
            return "second answer"
        self._second.set()
        return "first answer"

    def manager(self, config: ServiceConfig) -> SessionManager:
        model = FunctionModel(self.reply)
        return SessionManager(self.store, config=config, resolve_model=lambda spec, url: model)

    async def run(self, manager: SessionManager) -> str:
        """Create the session and send it a message as its first run ends; its id."""
        sid = await manager.create(CreateSession(task="task", model="fake:x"))
        await asyncio.wait_for(self._ended_held.wait(), 30)
        sending = asyncio.create_task(manager.send(sid, "more"))
        await asyncio.wait_for(self._read.wait(), 30)  # it read the record: running
        self._gate.set()  # the first run's end is written while the message is in flight
        await asyncio.wait_for(sending, 30)
        return sid


def _config(tmp_path: Path, *, resume: bool = False) -> ServiceConfig:
    return ServiceConfig(
        token=TOKEN, db_path=tmp_path / "s.db", backend="subprocess", model="fake:x",
        resume_orphans=resume, lease_s=30,
    )  # fmt: skip


async def test_a_message_sent_while_the_run_ends_keeps_the_record_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        race = Race(store, monkeypatch)
        manager = race.manager(_config(tmp_path))
        await manager.start()
        try:
            sid = await race.run(manager)
            # the second run is running (its model call waits): the record says so
            record = await store.get_session(sid)
            assert record is not None
            assert record.status == "running", (record.status, record.result)
            assert replay(await store.events(sid)).run_open
            race.release.set()
            status, result = await manager.result(sid, timeout_s=30)
        finally:
            await manager.aclose()
        events = await store.events(sid)
    assert status == "finished" and result["output"] == "second answer", (status, result)
    state = replay(events)
    assert not state.run_open and not state.pending
    assert [e.kind for e in events].count("SessionEnded") == 2


async def test_a_crash_during_the_run_the_message_started_is_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SQLiteStore(tmp_path / "s.db") as store:
        race = Race(store, monkeypatch)
        manager = race.manager(_config(tmp_path))
        await manager.start()
        try:
            sid = await race.run(manager)
        finally:
            await manager.aclose()  # as a crash: the second run's end is never written
        assert replay(await store.events(sid)).run_open
        race.release.set()
        restarted = race.manager(_config(tmp_path, resume=True))
        await restarted.start()  # it resumes the sessions its predecessor left running
        try:
            status, result = await restarted.result(sid, timeout_s=30)
        finally:
            await restarted.aclose()
        events = await store.events(sid)
    state = replay(events)
    assert not state.run_open and not state.pending, [e.kind for e in events]
    assert status == "finished" and result["output"] == "second answer", (status, result)


async def test_a_run_that_ends_while_the_next_one_runs_leaves_the_record_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The message is recorded while the run runs; the run ends before the message reaches
    the session, which starts the next run; only then is the first run's end written."""
    first_done, second_done, second_called = asyncio.Event(), asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    async def reply(request: Request) -> str:
        calls.append(1)
        if len(calls) == 1:
            await first_done.wait()
            return "first answer"
        second_called.set()
        await second_done.wait()
        return "second answer"

    held, gate = asyncio.Event(), asyncio.Event()
    async with SQLiteStore(tmp_path / "s.db") as store:
        real_append = store.append

        async def append(
            sid: str, events: Any, *, owner: str, generation: int | None = None
        ) -> int:
            if any(e.kind == "MessageReceived" for e in events) and not gate.is_set():
                held.set()
                await gate.wait()
            return await real_append(sid, events, owner=owner, generation=generation)

        monkeypatch.setattr(store, "append", append)
        model = FunctionModel(reply)
        manager = SessionManager(
            store, config=_config(tmp_path), resolve_model=lambda spec, url: model
        )
        await manager.start()
        try:
            sid = await manager.create(CreateSession(model="fake:x"))
            live = manager._live[sid]
            gate.set()
            await manager.send(sid, "task")
            gate.clear()
            held.clear()
            sending = asyncio.create_task(manager.send(sid, "more"))
            await asyncio.wait_for(held.wait(), 30)  # recorded while the first run runs
            first_done.set()
            first = await asyncio.wait_for(live.session.result(), 30)
            assert first.output == "first answer"  # it ended; its end waits for the journal
            gate.set()
            await asyncio.wait_for(sending, 30)  # "more" starts the second run
            await asyncio.wait_for(second_called.wait(), 30)
            await live.journal.flush()  # the first run's end is written
            record = await store.get_session(sid)
            assert record is not None
            assert [e.kind for e in await store.events(sid)].count("SessionEnded") == 1
            assert record.status == "running", (record.status, record.result)
            second_done.set()
            status, result = await manager.result(sid, timeout_s=30)
        finally:
            await manager.aclose()
        events = await store.events(sid)
    assert status == "finished" and result["output"] == "second answer", (status, result)
    state = replay(events)
    assert not state.run_open and not state.pending


async def test_a_resume_sending_two_messages_keeps_the_record_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume sends two untaken messages; the run the first starts ends while the second
    reopens the record (the same race, by the resume's own deliveries)."""
    release, second_called = asyncio.Event(), asyncio.Event()
    calls: list[int] = []

    async def reply(request: Request) -> str:
        calls.append(1)
        if len(calls) == 1:
            return "first answer"
        second_called.set()
        await release.wait()
        return "second answer"

    ended_written, finishing = asyncio.Event(), asyncio.Event()
    gated: list[bool] = []
    async with SQLiteStore(tmp_path / "s.db") as store:
        request = CreateSession(model="fake:x").model_dump(mode="json")
        await store.create_session("s", config=request, owner="dead", lease_s=0.01)
        await store.append("s", [
            NewEvent(seq=1, kind="MessageReceived", payload={"id": "m1", "text": "one"}, ts=0.0),
            NewEvent(seq=2, kind="MessageReceived", payload={"id": "m2", "text": "two"}, ts=0.0),
        ], owner="dead")  # fmt: skip
        await store.release("s", owner="dead")
        real_append, real_get, real_finish = store.append, store.get_session, store.finish_session
        model = FunctionModel(reply)
        manager = SessionManager(
            store, config=_config(tmp_path), resolve_model=lambda spec, url: model
        )

        async def append(
            sid: str, events: Any, *, owner: str, generation: int | None = None
        ) -> int:
            seq = await real_append(sid, events, owner=owner, generation=generation)
            if any(e.kind == "SessionEnded" for e in events):
                ended_written.set()
            return seq

        async def get_session(sid: str) -> Any:
            live = manager._live.get(sid)
            running = live is not None and live.session.running
            record = await real_get(sid)
            if running and not gated:
                gated.append(True)  # the second delivery read the record: running
                await asyncio.wait_for(ended_written.wait(), 30)  # the first run ended
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finishing.wait(), 1)
            return record

        async def finish_session(sid: str, **kwargs: Any) -> Any:
            finishing.set()
            return await real_finish(sid, **kwargs)

        monkeypatch.setattr(store, "append", append)
        monkeypatch.setattr(store, "get_session", get_session)
        monkeypatch.setattr(store, "finish_session", finish_session)
        await manager.start()
        try:
            await manager.resume("s")
            assert gated and len(calls) >= 1
            # the second run (the message "two") waits in the model
            await asyncio.wait_for(second_called.wait(), 30)
            record = await real_get("s")
            assert record is not None
            assert record.status == "running", (record.status, record.result)
            release.set()
            status, result = await manager.result("s", timeout_s=30)
        finally:
            await manager.aclose()
        events = await store.events("s")
    assert status == "finished" and result["output"] == "second answer", (status, result)
    state = replay(events)
    assert not state.run_open and not state.pending
