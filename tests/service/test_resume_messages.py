"""Resume keeps every accepted message exactly once (``kill -9`` of a real ``sunroom serve``).

Messages carry ids in the log (``MessageReceived``); a ``Transcript`` event names the ids the
run took in. A resume re-sends only the ids no transcript took, and never records them again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from sunroom.providers import UserMessage
from sunroom.service.recovery import replay
from tests.service.test_crash import TOKEN, Service, read, wait_for

KILLS = 3


def _env(tmp: Path, script: dict[str, Any]) -> dict[str, str]:
    (tmp / "script.json").write_text(json.dumps(script))
    return {**os.environ, "SUNROOM_TOKEN": TOKEN,
            "SUNROOM_MODEL": f"scripted:{tmp / 'script.json'}",
            "SUNROOM_TEST_LEDGER": str(tmp / "ledger.txt")}  # fmt: skip


def _restarts(db: Path, sid: str) -> int:
    return sum(e.kind == "KernelRestarted" for e in read(db, sid)[0])


@pytest.mark.parametrize(
    "kills",
    [pytest.param(KILLS, id="3-kills"), pytest.param(5, id="5-kills", marks=pytest.mark.slow)],
)
def test_kills_in_the_first_model_call_do_not_multiply_the_task(tmp_path: Path, kills: int) -> None:
    # each kill lands 0.1 s into a 1.5 s model call: 1.4 s of slack for a slow poll of the log
    env = _env(tmp_path, {"replies": ["done"], "delay_s": 1.5})
    db = tmp_path / "s.db"
    service = Service(tmp_path, env)
    sid = service.client.post("/sessions", json={"task": "the task"}).json()["session_id"]
    for k in range(kills):
        if k == 0:
            wait_for(lambda: any(e.kind == "MessageReceived" for e in read(db, sid)[0]))
        else:
            wait_for(lambda k=k: _restarts(db, sid) == k)
        time.sleep(0.1)  # in the model call (1.5 s): the task is not in the transcript yet
        service.kill()
        service = Service(tmp_path, env)
    wait_for(lambda: _restarts(db, sid) == kills)
    try:
        r = service.client.get(f"/sessions/{sid}/result", params={"timeout": 60})
        assert r.status_code == 200, r.text
        body = r.json()
    finally:
        service.stop()
    assert body["status"] == "finished" and body["result"]["status"] == "success", body
    events = read(db, sid)[0]
    kinds = [e.kind for e in events]
    received = kinds.count("MessageReceived")
    transcript = replay(events).transcript
    told = sum(m.text.count("the task") for m in transcript if isinstance(m, UserMessage))
    print("kills", kills, "MessageReceived", received, "task in transcript", told)
    assert received == 1, kinds
    assert told == 1, [m for m in transcript if isinstance(m, UserMessage)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert kinds.count("SessionEnded") == 1


def test_an_accepted_submit_survives_a_kill_before_the_run_ends(tmp_path: Path) -> None:
    # the cell submits, then runs on for 3 s: the kill lands between SubmitAccepted and the end
    code = "submit('the answer')\nprint(charge(7))\nimport time\ntime.sleep(3)"
    env = _env(tmp_path, {"replies": [{"code": code}, "a second answer"], "delay_s": 0.05})
    db = tmp_path / "s.db"
    service = Service(tmp_path, env)
    sid = service.client.post("/sessions", json={"task": "answer"}).json()["session_id"]
    wait_for(lambda: any(e.kind == "SubmitAccepted" for e in read(db, sid)[0]))
    service.kill()
    service = Service(tmp_path, env)
    try:
        wait_for(lambda: _restarts(db, sid) == 1)
        r = service.client.get(f"/sessions/{sid}/result", params={"timeout": 60})
        assert r.status_code == 200, r.text
        body = r.json()
    finally:
        service.stop()
    assert body["status"] == "finished", body
    assert body["result"]["status"] == "success" and body["result"]["output"] == "the answer"
    events = read(db, sid)[0]
    kinds = [e.kind for e in events]
    assert kinds.count("SessionEnded") == 1 and kinds.count("MessageReceived") == 1, kinds
    assert kinds.index("KernelRestarted") < kinds.index("SessionEnded")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    ended = next(e for e in events if e.kind == "SessionEnded")
    assert ended.payload["result"]["output"] == "the answer"


def test_a_message_sent_while_the_run_ends_is_answered(tmp_path: Path) -> None:
    # the message arrives during the cell that submitted: the run ends without taking it in
    code = "submit('first')\nimport time\ntime.sleep(1)"
    env = _env(tmp_path, {"replies": [{"code": code}, "second"], "delay_s": 0.05})
    db = tmp_path / "s.db"
    service = Service(tmp_path, env)
    try:
        sid = service.client.post("/sessions", json={"task": "answer"}).json()["session_id"]
        wait_for(lambda: any(e.kind == "SubmitAccepted" for e in read(db, sid)[0]))
        r = service.client.post(f"/sessions/{sid}/messages", json={"text": "late message"})
        assert r.status_code == 202, r.text

        def ended_twice() -> bool:
            return [e.kind for e in read(db, sid)[0]].count("SessionEnded") == 2

        wait_for(ended_twice, timeout=20)
        r = service.client.get(f"/sessions/{sid}/result", params={"timeout": 30})
        body = r.json()
    finally:
        service.stop()
    assert body["status"] == "finished" and body["result"]["output"] == "second", body
    events = read(db, sid)[0]
    state = replay(events)
    assert [m.text for m in state.messages] == ["answer", "late message"]
    assert all(m.taken and m.answered for m in state.messages), state.messages
    told = sum(m.text.count("late message") for m in state.transcript if isinstance(m, UserMessage))
    assert told == 1


@pytest.mark.slow
def test_messages_sent_between_kills_are_each_answered_once(tmp_path: Path) -> None:
    cell = {"code": "import time\ntime.sleep(0.3)"}
    env = _env(tmp_path, {"replies": [cell, cell, cell, "done"], "delay_s": 0.3})
    db = tmp_path / "s.db"
    service = Service(tmp_path, env)
    sid = service.client.post("/sessions", json={"task": "the task"}).json()["session_id"]
    texts = ["the task"]
    for k in range(3):
        wait_for(lambda k=k: _restarts(db, sid) == k)
        time.sleep(0.2 + 0.25 * k)
        text = f"message {k}"
        r = service.client.post(f"/sessions/{sid}/messages", json={"text": text})
        assert r.status_code == 202, r.text
        texts.append(text)
        time.sleep(0.1 * k)
        service.kill()
        service = Service(tmp_path, env)
    try:
        wait_for(lambda: _restarts(db, sid) == 3)
        r = service.client.get(f"/sessions/{sid}/result", params={"timeout": 60})
        body = r.json()
    finally:
        service.stop()
    assert body["status"] == "finished" and body["result"]["status"] == "success", body
    events = read(db, sid)[0]
    state = replay(events)
    assert [m.text for m in state.messages] == texts
    assert all(m.taken and m.answered for m in state.messages), state.messages
    users = [m.text for m in state.transcript if isinstance(m, UserMessage)]
    for text in texts:
        assert sum(u.count(text) for u in users) == 1, (text, users)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
