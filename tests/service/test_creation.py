"""Bursts of session creation (issue 26, item 5): accepted at once, kernels started concurrently.

Real server on loopback, real subprocess kernels, scripted models. ``POST /sessions`` answers
201 once the session is recorded (with its task); its kernel starts in the background and the
log says so (``KernelStarted``, or ``KernelStartFailed`` with the record ``failed``). Not timed:
``benchmarks/session_burst.py`` measures the burst against raw kernels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sunroom.providers import Model, ScriptedModel
from tests.service.conftest import Server, code
from tests.service.test_routes import sse

N = 24
ROOT = Path(__file__).resolve().parents[2]


def test_concurrent_creations_all_succeed_and_every_kernel_starts(
    make_server: Callable[..., Server],
) -> None:
    """Before: no ``KernelStarted``; the creations waited for each other's kernel starts."""

    def model() -> Model:
        return ScriptedModel([code("print(6 * 7)"), "done"])

    server = make_server(model)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=server.url, headers=server.client.headers, timeout=120
        ) as client:
            return await asyncio.gather(
                *(client.post("/sessions", json={"task": f"task {i}"}) for i in range(N))
            )

    answers = asyncio.run(burst())
    assert [r.status_code for r in answers] == [201] * N, [r.text for r in answers]
    sids = [r.json()["session_id"] for r in answers]
    assert len(set(sids)) == N
    for i, sid in enumerate(sids):
        body = server.client.get(f"/sessions/{sid}/result", params={"timeout": 60}).json()
        assert body["status"] == "finished", body
        events = list(sse(server, sid, after=0))
        kinds = [e["event"] for e in events]
        assert kinds[0] == "MessageReceived" and kinds[1] == "KernelStarted", kinds
        assert events[0]["data"]["text"] == f"task {i}"
        assert events[1]["data"]["seconds"] > 0
        output = next(e["data"]["output"] for e in events if e["event"] == "ExecutionFinished")
        assert output.strip() == "42"
    health: dict[str, Any] = server.anon.get("/healthz").json()
    assert health["sessions"] == N, health


def test_a_kernel_that_does_not_start_is_told_in_the_log_and_frees_its_slot(
    make_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_server(lambda: ScriptedModel(["done"]), max_sessions=1)
    # a host misconfigured after the server started: the launch refuses, in the background
    monkeypatch.setenv("SUNROOM_WATCHER", "bogus")
    r = server.client.post("/sessions", json={"task": "t"})
    assert r.status_code == 201, r.text  # accepted: the kernel starts after the answer
    sid = r.json()["session_id"]
    body = server.client.get(f"/sessions/{sid}/result", params={"timeout": 60}).json()
    assert body["status"] == "failed", body
    events = list(sse(server, sid, after=0))
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["MessageReceived", "KernelStartFailed"], kinds
    error = events[1]["data"]["error"]
    assert "kernel" in error and "\n" not in error, error  # one line
    assert str(ROOT) not in error and "Traceback" not in error, error  # no host path or trace
    assert "SUNROOM_WATCHER" in error, error  # the cause, for the person who can fix it
    monkeypatch.delenv("SUNROOM_WATCHER")
    r = server.client.post("/sessions", json={"task": "t"})  # its slot is free again
    assert r.status_code == 201, r.text
    body = server.client.get(
        f"/sessions/{r.json()['session_id']}/result", params={"timeout": 60}
    ).json()
    assert body["status"] == "finished", body
