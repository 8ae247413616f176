"""A running cell's output reaches an SSE client while the cell runs, and stays in the log."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sunroom.providers import ScriptedModel
from tests.service.conftest import Server, code
from tests.service.test_routes import sse


def test_a_chunk_reaches_sse_before_the_cell_ends_and_is_replayed_later(
    make_server: Callable[..., Server],
) -> None:
    release = threading.Event()

    def wait_for_host() -> bool:
        """Returns when the test lets the cell go on (False: it never did)."""
        return release.wait(120)

    cell = "print('first line', flush=True)\nprint('released:', wait_for_host())\n"
    server = make_server(ScriptedModel([code(cell), "done"]), functions=[wait_for_host])
    sid = server.client.post("/sessions", json={"task": "go"}).json()["session_id"]
    kinds: list[str] = []
    texts: list[str] = []
    for event in sse(server, sid):
        kinds.append(event["event"])
        if event["event"] == "OutputChunk":
            texts.append(event["data"]["text"])
            if "first line" in event["data"]["text"]:
                # the cell is blocked in wait_for_host: this chunk can only be live output
                assert "ExecutionFinished" not in kinds
                assert "CellStarted" in kinds
                release.set()
    assert release.is_set()
    assert "".join(texts) == "first line\nreleased: True\n"
    assert kinds.index("OutputChunk") < kinds.index("ExecutionFinished") < kinds.index("end")
    replay = list(sse(server, sid))  # a later reader gets them from the store
    chunks = [e["data"] for e in replay if e["event"] == "OutputChunk"]
    assert "".join(c["text"] for c in chunks) == "first line\nreleased: True\n"
    assert all(c["stream"] == "stdout" and c["turn"] == 1 and c["cell"] == 1 for c in chunks)
    started = next(e["data"] for e in replay if e["event"] == "CellStarted")
    assert started["lines"] == 2 and started["cell"] == 1
