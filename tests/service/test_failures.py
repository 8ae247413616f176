"""Failures the service cannot act on are logged with their traceback, never swallowed.

A real SQLite store behind a fake that fails chosen calls, real kernels (subprocess backend),
scripted models.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from sunroom.errors import StoreError
from sunroom.providers import FunctionModel, Model, Request, ScriptedModel
from sunroom.sandbox.functions import as_host_function
from sunroom.service import ServiceConfig, SessionManager
from sunroom.service.journal import CallLedger
from sunroom.service.schemas import CreateSession
from sunroom.service.signals import Signals
from sunroom.service.sse import EventStream
from sunroom.store import EventStore, SQLiteStore
from tests.service.conftest import TOKEN, Server

LOG = "sunroom.service"


class BrokenStore:
    """The store, except that the methods named in ``failing`` raise StoreError."""

    def __init__(self, inner: SQLiteStore, *failing: str) -> None:
        self.inner = inner
        self.failing = set(failing)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in self.failing:
            return attr

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise StoreError(f"{name} failed (injected)")

        return broken


def tracebacks(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.exc_info is not None and text in r.getMessage() + str(r.exc_info[1])
    ]


async def wait_for_log(caplog: pytest.LogCaptureFixture, text: str, within: float = 20) -> None:
    deadline = time.monotonic() + within
    while not tracebacks(caplog, text):
        assert time.monotonic() < deadline, f"no traceback logged for {text!r}: {caplog.text}"
        await asyncio.sleep(0.02)


def config(tmp_path: Path) -> ServiceConfig:
    return ServiceConfig(
        token=TOKEN, db_path=tmp_path / "s.db", backend="subprocess", model="fake:x",
        resume_orphans=False,
    )  # fmt: skip


async def test_a_failure_to_record_a_sessions_end_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=LOG)
    async with SQLiteStore(tmp_path / "s.db") as inner:
        store = cast(EventStore, BrokenStore(inner, "finish_session"))
        manager = SessionManager(
            store, config=config(tmp_path), resolve_model=lambda spec, url: ScriptedModel(["done"])
        )
        await manager.start()
        try:
            await manager.create(CreateSession(task="t"))
            await wait_for_log(caplog, "finish_session failed")
        finally:
            await manager.aclose()


async def test_a_cancelled_call_whose_outcome_cannot_be_recorded_is_logged_and_still_cancelled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=LOG)
    started = asyncio.Event()

    async def wait_forever() -> str:
        """Never returns."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    async with SQLiteStore(tmp_path / "s.db") as inner:
        await inner.create_session("s", config={}, owner="me", lease_s=60)
        ledger = CallLedger(cast(EventStore, BrokenStore(inner, "mark_unknown")), "s", owner="me",
                            first_call=1)  # fmt: skip
        wrapped = ledger.wrap(as_host_function(wait_forever))
        call = asyncio.ensure_future(wrapped.fn())
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_for_log(caplog, "mark_unknown failed")


async def test_cancelling_an_event_stream_is_never_swallowed(tmp_path: Path) -> None:
    """The stream's own cancellation propagates even while it waits for its client watcher."""
    cfg = config(tmp_path)
    async with SQLiteStore(cfg.db_path) as store:
        await store.create_session("s", config={}, owner="me", lease_s=60)
        await store.finish_session("s", status="finished", result={}, owner="me")
        watching, release = asyncio.Event(), asyncio.Event()

        async def receive() -> Any:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:  # a slow client watcher: it takes a while to stop
                watching.set()
                await release.wait()
                raise

        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        stream = EventStream(store=store, signals=Signals(), config=cfg, sid="s", after=0)
        task = asyncio.ensure_future(stream({"type": "http"}, receive, send))
        await asyncio.wait_for(watching.wait(), 10)  # the stream ended; it is stopping its watcher
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
        finally:
            release.set()


def test_an_internal_bug_ends_the_run_as_internal_error_logged_with_its_traceback(
    make_server: Callable[..., Server], caplog: pytest.LogCaptureFixture
) -> None:
    def buggy(request: Request) -> str:
        raise KeyError("a bug, not the model's fault")

    def model() -> Model:
        return FunctionModel(buggy)

    server = make_server(model)
    with caplog.at_level(logging.ERROR):
        sid = server.client.post("/sessions", json={"task": "t"}).json()["session_id"]
        body = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20}).json()
    assert body["status"] == "failed"
    assert body["result"]["status"] == "internal_error", body
    assert "KeyError" in body["result"]["error"]
    assert [r for r in caplog.records if r.exc_info and "a bug, not" in str(r.exc_info[1])]


def test_a_model_failure_is_still_model_error(make_server: Callable[..., Server]) -> None:
    from sunroom.errors import OverloadedError

    server = make_server(lambda: ScriptedModel([OverloadedError("busy", provider="x")]))
    sid = server.client.post("/sessions", json={"task": "t"}).json()["session_id"]
    body = server.client.get(f"/sessions/{sid}/result", params={"timeout": 20}).json()
    assert body["result"]["status"] == "model_error"


async def test_a_session_that_cannot_be_resumed_is_logged_and_recorded_interrupted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=LOG)
    cfg = config(tmp_path).model_copy(update={"resume_orphans": True, "lease_s": 0.5})
    async with SQLiteStore(cfg.db_path) as store:
        bad = CreateSession(task="t", model="nope:x").model_dump(mode="json")
        await store.create_session("orphan", config=bad, owner="dead", lease_s=0.01)
        from sunroom.service import resolve_model

        manager = SessionManager(store, config=cfg, resolve_model=resolve_model)
        await manager.start()
        try:
            await wait_for_log(caplog, "unknown provider")
            deadline = time.monotonic() + 10
            while (record := await store.get_session("orphan")) and record.status == "running":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert record is not None and record.status == "interrupted"
        finally:
            await manager.aclose()
