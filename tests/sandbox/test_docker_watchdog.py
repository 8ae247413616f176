"""The docker watchdog is a real host-side module: run by path, it waits for its owner's death,
then removes exactly the owner's containers. Against a fake Docker Engine on a Unix socket
(the real daemon is covered by ``test_docker.py``'s kill -9 test).
"""

from __future__ import annotations

import json
import os
import socketserver
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from sunroom.sandbox.backends import docker_janitor, docker_watchdog

CONTAINERS: list[dict[str, Any]] = [
    {"Id": "a" * 64, "Labels": {"sunroom.kernel": "1", "sunroom.owner_pid": "42", "h": "x"}},
    {"Id": "b" * 64, "Labels": {"sunroom.kernel": "1", "sunroom.owner_pid": "43", "h": "x"}},
    {"Id": "c" * 64, "Labels": {"sunroom.owner_pid": "42", "h": "x"}},  # not a kernel
]


def _labels(container: dict[str, Any]) -> set[str]:
    return {f"{k}={v}" for k, v in container["Labels"].items()}


class FakeEngine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.requests: list[tuple[str, str]] = []
        super().__init__(path, Handler)


class Handler(BaseHTTPRequestHandler):
    server: FakeEngine

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # a Unix socket has no client address to log

    def _reply(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.server.requests.append(("GET", url.path))
        if url.path.endswith("/version"):
            self._reply({"ApiVersion": "1.43", "Version": "24.0.0"})
            return
        if url.path.endswith("/containers/json"):
            query = urllib.parse.parse_qs(url.query)
            wanted = json.loads(query["filters"][0])["label"]
            rows = [c for c in CONTAINERS if set(wanted) <= _labels(c)]
            self._reply(rows)
            return
        self._reply({"message": "not found"}, 404)

    def do_DELETE(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.server.requests.append(("DELETE", url.path))
        self.send_response(204)
        self.end_headers()


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[FakeEngine, str]]:
    path = str(tmp_path / "docker.sock")
    server = FakeEngine(path)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, path
    server.shutdown()
    server.server_close()


def test_the_watchdog_removes_its_owners_containers_when_the_owner_goes(
    engine: tuple[FakeEngine, str],
) -> None:
    server, path = engine
    assert docker_watchdog.__file__ == docker_janitor.WATCHDOG
    read_end, write_end = os.pipe()
    env = {"DOCKER_HOST": f"unix://{path}", "PATH": os.environ.get("PATH", "")}
    watchdog = subprocess.Popen(
        [sys.executable, "-I", "-X", "importtime", docker_janitor.WATCHDOG,
         "sunroom.owner_pid", "42", "h", "x"],
        stdin=read_end, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    os.close(read_end)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            watchdog.wait(0.5)  # the owner (this test) lives: the watchdog waits
        assert server.requests == []
        os.close(write_end)  # the owner is gone
        _, stderr = watchdog.communicate(timeout=30)
    finally:
        if watchdog.poll() is None:
            watchdog.kill()
            watchdog.wait()
    assert watchdog.returncode == 0, stderr
    deleted = [p for m, p in server.requests if m == "DELETE"]
    assert deleted == [f"/v1.43/containers/{'a' * 64}"]
    imported = {line.split("|")[-1].strip() for line in stderr.splitlines() if "|" in line}
    assert "docker" in imported
    assert not any(name.startswith("sunroom") for name in imported)  # stdlib and the SDK only


def test_the_watchdog_refuses_to_match_every_kernel() -> None:
    with pytest.raises(ValueError, match="LABEL VALUE"):
        docker_watchdog.labels_from([])
    with pytest.raises(ValueError, match="LABEL VALUE"):
        docker_watchdog.labels_from(["sunroom.owner_pid"])
    assert docker_watchdog.labels_from(["k", "v"]) == ["sunroom.kernel=1", "k=v"]
