"""Replicas of ``sunroom serve`` as real subprocesses sharing one store, for the cluster tests.

Each :class:`Replica` listens on its own loopback port, advertises it as its internal URL and
loads the side-effecting ``charge`` host function (:mod:`tests.service.hostfns`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "replica-test-token-0123456789"


def free_port() -> int:
    """A loopback port nobody listens on now (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Replica:
    """One ``sunroom serve`` replica (started by the constructor, healthy on return)."""

    def __init__(
        self,
        name: str,
        db: str,
        env: dict[str, str],
        *,
        logs: Path,
        lease_s: float,
        grace_s: float = 5,
    ) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with self.log.open("w") as err:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sunroom.cli", "serve", "--port", str(port), "--db", db,
                 "--advertise-url", self.url, "--backend", "subprocess",
                 "--functions", "tests.service.hostfns:charge", "--lease-s", str(lease_s),
                 "--drain-grace-s", str(grace_s)],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True,
            )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "listening on" in line, line + self.stderr()
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.client.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"replica {name} did not become ready")

    def kill(self) -> None:
        """SIGKILL the server (its kernels die with their supervisors)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM; its exit status (it drains first)."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._close()
        return code

    def stop(self) -> None:
        """Stop it whatever its state (SIGTERM, then SIGKILL); idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close()

    def stderr(self) -> str:
        """What the server wrote on stderr so far."""
        return self.log.read_text(errors="replace")

    def _close(self) -> None:
        self.client.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def environment(tmp: Path, script: Path) -> dict[str, str]:
    """The replicas' environment: token, scripted model, the ledger of ``charge``."""
    return {
        **os.environ,
        "SUNROOM_TOKEN": TOKEN,
        "SUNROOM_MODEL": f"scripted:{script}",
        "SUNROOM_TEST_LEDGER": str(tmp / "ledger.txt"),
    }
