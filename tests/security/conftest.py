"""The security harness: canaries planted on the host before each attack.

* ``SUNROOM_CANARY_ENV`` in the host environment,
* a secret file in the host user's home directory,
* a TCP listener on a loopback port, counting every connection it accepts,
* a decoy Unix socket, counting every connection it accepts.

Each test runs one attack inside a real isolated kernel and its permitted control, then checks
that no canary leaked and no connection arrived.
"""

from __future__ import annotations

import secrets
import socket
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sunroom import AsyncKernel, Limits


@dataclass
class Canaries:
    secret: str
    env_name: str
    home_file: Path
    tcp_port: int
    unix_path: str
    connections: list[str] = field(default_factory=list)

    def leaked(self, text: str | None) -> bool:
        return text is not None and self.secret in text

    def settle(self, timeout_s: float = 10.0) -> list[str]:
        """Every connection that reached a listener so far, observed without a fixed sleep.

        A control connection is made to each listener from the host; listeners accept in
        order, so once both controls are seen every earlier connection has been recorded.
        The controls are then removed from :attr:`connections`.
        """
        before = len(self.connections)
        tcp = socket.create_connection(("127.0.0.1", self.tcp_port))
        uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        uds.connect(self.unix_path)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                seen = self.connections[before:]
                if "tcp" in seen and "unix" in seen:
                    break
                time.sleep(0.005)
            else:
                raise AssertionError("the canary listeners did not accept the host's control")
        finally:
            tcp.close()
            uds.close()
        for label in ("tcp", "unix"):
            # the last entry of each kind is the control (accepted after anything earlier)
            idx = len(self.connections) - 1 - self.connections[::-1].index(label)
            del self.connections[idx]
        return list(self.connections)


def _listen(sock: socket.socket, label: str, hits: list[str], stop: threading.Event) -> None:
    sock.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = sock.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        hits.append(label)
        conn.close()


@pytest.fixture
def canaries(monkeypatch: pytest.MonkeyPatch) -> Iterator[Canaries]:
    secret = "canary-" + secrets.token_hex(12)
    monkeypatch.setenv("SUNROOM_CANARY_ENV", secret)
    home = Path.home() / f".sunroom-canary-{secrets.token_hex(4)}"
    home.write_text(secret)
    tcp = socket.create_server(("127.0.0.1", 0))
    unix_dir = tempfile.mkdtemp(prefix="sunroom-decoy-")
    unix_path = f"{unix_dir}/decoy.sock"
    uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    uds.bind(unix_path)
    uds.listen()
    c = Canaries(secret, "SUNROOM_CANARY_ENV", home, tcp.getsockname()[1], unix_path)
    stop = threading.Event()
    threads = [
        threading.Thread(target=_listen, args=(tcp, "tcp", c.connections, stop)),
        threading.Thread(target=_listen, args=(uds, "unix", c.connections, stop)),
    ]
    for t in threads:
        t.start()
    try:
        yield c
    finally:
        stop.set()
        for t in threads:
            t.join()
        tcp.close()
        uds.close()
        home.unlink()
        Path(unix_path).unlink(missing_ok=True)
        Path(unix_dir).rmdir()
        assert c.connections == [], f"connections reached the host: {c.connections}"


JAIL_LIMITS = Limits(timeout_s=10, memory_mb=256, pids=64, disk_mb=32)
"""The limits of the kernel each attack runs in."""


@pytest.fixture
async def jail(isolated_backend: str) -> AsyncIterator[AsyncKernel]:
    async with AsyncKernel(backend=isolated_backend, limits=JAIL_LIMITS) as k:
        yield k
