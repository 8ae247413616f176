"""A full disk under the store (issue 26, item 2): a transient fault must not become permanent.

A real server on loopback, its SQLite store on a real 2 MiB tmpfs (mounted here; root only),
real kernels (subprocess backend), a model that fills the log with big cell outputs. The disk
is filled until the session's events cannot be stored, then space is freed.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sunroom.providers import AssistantMessage, FunctionModel, Request, ToolCall, UserMessage
from tests.service.conftest import Server

BIG = 'print("x" * 60_000)'


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, mounted for this test and unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root: this test fills a real small filesystem")
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fill(path: Path, leave: int, name: str = "filler") -> Path:
    """Write a filler file on *path*'s filesystem until only about *leave* bytes are free."""
    filler = path / name
    with open(filler, "wb") as f:
        while (room := _free(path) - leave) > 0:
            try:
                f.write(b"\0" * min(room, 256 * 1024))
                f.flush()
            except OSError:
                break
    return filler


def _model(request: Request) -> AssistantMessage | str:
    """``big``: cells that print 60 kB each, for ever; anything else: answer at once."""
    first = next(m for m in request.messages if isinstance(m, UserMessage))
    if "big" not in first.text:
        return "done"
    turn = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
    return AssistantMessage([ToolCall(f"call_{turn}", "execute_code", {"code": BIG})])


def _wait(check: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_session_whose_events_cannot_be_stored_ends_failed_and_never_refills_the_disk(
    small_disk: Path, make_server: Callable[..., Server]
) -> None:
    server = make_server(lambda: FunctionModel(_model), db_path=small_disk / "s.db", lease_s=1.0)
    other = server.client.post("/sessions", json={"task": "hello"}).json()["session_id"]
    r = server.client.get(f"/sessions/{other}/result", params={"timeout": 25})
    assert r.status_code == 200 and r.json()["status"] == "finished", r.text
    filler = _fill(small_disk, leave=400_000)
    try:
        sid = server.client.post("/sessions", json={"task": "big"}).json()["session_id"]
        # the disk fills: the session ends, clearly, though its record cannot be written yet
        r = server.client.get(f"/sessions/{sid}/result", params={"timeout": 25})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "failed", body
        assert "could not be stored" in body["result"]["error"], body
        # the disk full to the last byte now: the few pages left above may have taken the
        # session's small end record already (then the message below would fit as well)
        _fill(small_disk, leave=0, name="rest")
        # a message meanwhile is refused (503), never accepted without being recorded. It is
        # larger than any slack a page of the store may still have (a short one could fit in
        # the last page's free bytes and be recorded, rightly, whether it does depends on how
        # far the session got before the disk filled)
        text = "big again " + "x" * 64_000
        r = server.client.post(f"/sessions/{sid}/messages", json={"text": text})
        assert r.status_code == 503, r.text
        time.sleep(3)  # several leases (1 s): nothing resumes it while the disk is full
    finally:
        filler.unlink()
        (small_disk / "rest").unlink(missing_ok=True)
    freed = _free(small_disk)
    # once space is back, the end is recorded; the session is not run again
    _wait(
        lambda: server.client.get(f"/sessions/{sid}").json()["status"] == "failed",
        20,
        "the session's end was not recorded after space came back",
    )
    time.sleep(4)  # several leases and orphan scans
    assert server.client.get(f"/sessions/{sid}").json()["status"] == "failed"
    used = freed - _free(small_disk)
    # the end and the other session's lease renewals write a few pages; a re-run of the
    # session (60 kB an event) would take the freed space again within seconds
    assert freed > 1_000_000, freed
    assert used < freed // 3, f"the store took {used} of the {freed} bytes freed"
    events = server.client.get(f"/sessions/{sid}/events", params={"after": 0})
    kinds = re.findall(r"^event: (\w+)$", events.text, flags=re.M)
    assert "SessionEnded" in kinds, kinds
    # nothing ran after its end: no message taken, no cell. (The message refused above may
    # have left a KernelRestarted: its resume wrote that before recording the message failed.)
    after = kinds[kinds.index("SessionEnded") + 1 :]
    ran = {"MessageReceived", "CodeSubmitted", "CellStarted", "ExecutionFinished"}
    assert not ran & set(after), after
    # the other session is unaffected: it runs again once space is back
    assert server.client.post(f"/sessions/{other}/messages", json={"text": "hi"}).status_code == 202
    r = server.client.get(f"/sessions/{other}/result", params={"timeout": 25})
    assert r.status_code == 200 and r.json()["status"] == "finished", r.text
    # ... and was never stopped: a lease renewal the full disk refused is not a lost lease
    events = server.client.get(f"/sessions/{other}/events", params={"after": 0})
    assert events.text.count("event: KernelRestarted") == 0, events.text[-2000:]
    with contextlib.suppress(Exception):
        server.client.delete(f"/sessions/{sid}")
