"""Fairness under load: /healthz never waits for the event loop; kernel work is admitted up to a
bound, and one more request is answered 429 with Retry-After at once instead of queueing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sunroom.errors import UsageError
from sunroom.sandbox.functions import host_function
from sunroom.service import ServiceConfig
from tests.service.conftest import Server

ROOT = Path(__file__).resolve().parents[2]
HOLD_S = 0.25
HEALTH = {
    "ok": True,
    "sessions": 0,
    "sessions_idle": 0,
    "sessions_released": 0,
    "e2b_sandboxes": 0,
}
"""The health body of a server without sessions (``kernels`` added per test)."""
"""How long one call of the inline host function holds the server's event loop."""


@host_function(inline=True)
def hog() -> int:
    """Busy-wait HOLD_S seconds on the server's event loop (inline: no thread)."""
    end = time.perf_counter() + HOLD_S
    while time.perf_counter() < end:
        pass
    return 1


def test_healthz_answers_while_the_event_loop_is_held(make_server: Callable[..., Server]) -> None:
    server = make_server(functions=[hog])
    kids = [server.client.post("/kernels", json={}).json()["kernel_id"] for _ in range(5)]
    calls = 4
    cell = f"sum(hog() for _ in range({calls}))"
    done = threading.Event()

    def run(kid: str) -> httpx.Response:
        return server.client.post(f"/kernels/{kid}/execute", json={"code": cell})

    worst = 0.0
    probes = 0
    with ThreadPoolExecutor(len(kids)) as pool:
        start = time.monotonic()
        futures = [pool.submit(run, kid) for kid in kids]

        def wait_all() -> None:
            for future in futures:
                future.exception()
            done.set()

        threading.Thread(target=wait_all).start()
        while not done.wait(0.05):  # the loop is held, one hog() after another, meanwhile
            t0 = time.perf_counter()
            r = server.anon.get("/healthz", timeout=10)
            worst = max(worst, time.perf_counter() - t0)
            probes += 1
            assert r.status_code == 200
            assert r.json() == HEALTH | {"kernels": len(kids)}
        held = time.monotonic() - start
        answers = [f.result() for f in futures]
    assert all(a.status_code == 200 and a.json()["value"] == str(calls) for a in answers)
    assert held >= 0.9 * len(kids) * calls * HOLD_S  # the inline calls ran one after another
    assert worst < 0.5, f"/healthz took {worst:.3f} s while the loop was held"
    assert probes >= 10, probes
    # a kept-alive connection goes from health checks to other requests (then on the loop)
    with httpx.Client(base_url=server.url, headers=server.client.headers, timeout=30) as http:
        assert http.get("/healthz").json() == HEALTH | {"kernels": len(kids)}
        assert http.get("/sessions").status_code == 200
        assert http.get("/healthz?verbose=1").json()["ok"] is True
        r = http.get("/healthz", headers={"host": "evil.example"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "HostNotAllowed"


def test_kernel_work_over_the_bound_is_answered_429_at_once(
    make_server: Callable[..., Server],
) -> None:
    bound = 2
    server = make_server(max_kernel_requests=bound)
    kids = [server.client.post("/kernels", json={}).json()["kernel_id"] for _ in range(6)]
    cell = "import time\ntime.sleep(1.5)\n'slept'"

    def run(kid: str) -> tuple[httpx.Response, float]:
        t0 = time.monotonic()
        r = server.client.post(f"/kernels/{kid}/execute", json={"code": cell})
        return r, time.monotonic() - t0

    with ThreadPoolExecutor(len(kids)) as pool:
        outcomes = list(pool.map(run, kids))
    ok = [r for r, _ in outcomes if r.status_code == 200]
    refused = [(r, took) for r, took in outcomes if r.status_code == 429]
    assert len(ok) == bound and len(refused) == len(kids) - bound, [r.text for r, _ in outcomes]
    assert all(r.json()["status"] == "ok" and r.json()["value"] == "'slept'" for r in ok)
    for r, took in refused:
        assert took < 1.0, took  # refused at once, not after queueing behind the sleeps
        assert r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert error["type"] == "CapacityError"
        assert error["message"] == (
            f"this server has its limit of {bound} kernel requests in flight; retry later"
        )
    assert server.client.post("/kernels", json={}).status_code == 201  # the slots came back
    r = server.client.post(f"/kernels/{kids[0]}/execute", json={"code": "1 + 1"})
    assert r.status_code == 200 and r.json()["value"] == "2"


@pytest.mark.parametrize("value", [0, -1, 65537])
def test_the_bound_out_of_range_is_refused_at_start(value: int) -> None:
    with pytest.raises(UsageError) as caught:
        ServiceConfig.from_env(max_kernel_requests=value)
    message = str(caught.value)
    assert message.startswith("invalid setting: max_kernel_requests: "), message
    assert ServiceConfig.from_env(max_kernel_requests=65536).max_kernel_requests == 65536
    assert ServiceConfig().max_kernel_requests == 256


@pytest.mark.parametrize(
    ("head", "close"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:8765\r\n\r\n", False),
        (b"GET /healthz?x=1 HTTP/1.1\r\nhost: localhost\r\nConnection: close\r\n\r\n", True),
        (b"GET /healthz HTTP/1.0\r\n\r\n", True),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n", False),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n", None),  # not whole yet: the loop's
        (b"GET /healthz HTTP/1.1\r\n\r\n", None),  # no Host
        (b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\n\r\n", None),
        (b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: 127.0.0.1\r\n\r\n", None),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}", None),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n", None),
        (b"GET /healthzz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", None),
        (b"POST /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", None),
        (b"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", None),
        (b"GET /healthz HTTP/2\r\nHost: 127.0.0.1\r\n\r\n", None),
        (b"GET /healthz HTTP/1.1\r\n Host: 127.0.0.1\r\n\r\n", None),
        (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX: " + b"a" * 100 + b"\r\n\r\n", None),
    ],
)
def test_only_a_plain_health_check_is_answered_by_the_gate(head: bytes, close: bool | None) -> None:
    from sunroom.service.health import parse_health_request

    expected = None if close is None else (len(head), close)  # the whole head is consumed
    config = ServiceConfig()
    assert parse_health_request(head, host_allowed=config.host_allowed, max_head=100) == expected


def test_sunroom_serve_refuses_the_bound_out_of_range(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "serve", "--port", "0", "--db",
         str(tmp_path / "s.db"), "--max-kernel-requests", "65537"],
        cwd=ROOT, env={**os.environ, "SUNROOM_TOKEN": "t" * 24}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "listening" not in proc.stdout
    assert proc.stderr.strip() == (
        "sunroom: invalid setting: max_kernel_requests: Input should be less than or equal to 65536"
    )
