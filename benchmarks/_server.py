"""``sunroom serve`` as a real subprocess on 127.0.0.1, for the benchmarks that measure it.

:func:`serve` starts ``python -m sunroom.cli serve --port 0`` from the checkout (this
checkout's ``sunroom`` first on ``PYTHONPATH``) with a fresh random token, reads the URL it
prints, waits until ``GET /healthz`` answers, yields a :class:`Server` and stops it (SIGTERM,
then waits) on the way out. The waiting happens before the caller measures anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Server:
    """A running ``sunroom serve``: its URL, its token and its process."""

    url: str
    token: str
    process: subprocess.Popen[str]

    @property
    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header the server's routes want."""
        return {"Authorization": f"Bearer {self.token}"}


@contextlib.contextmanager
def serve(
    *args: str,
    env: Mapping[str, str] | None = None,
    db: Path | str | None = None,
    port: int = 0,
    stop_timeout: float = 60.0,
) -> Iterator[Server]:
    """Run ``sunroom serve --port PORT --db DB ARGS`` until the block ends; yield it once it answers.

    *env* is added to this process's environment (after ``SUNROOM_TOKEN`` and ``PYTHONPATH``,
    so it may override them); *db* (a SQLite path or a ``postgresql://`` URL) defaults to a new
    temporary directory's ``s.db``. Raises
    ``RuntimeError`` when the server exits before printing its URL or never answers
    ``/healthz`` within 10 s.
    """
    token = secrets.token_urlsafe(24)
    if db is None:
        db = Path(tempfile.mkdtemp(prefix="sunroom-bench-")) / "s.db"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    full_env = {**os.environ, "SUNROOM_TOKEN": token, "PYTHONPATH": path, **(env or {})}
    process = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "serve", "--port", str(port), "--db", str(db), *args],
        cwd=ROOT, env=full_env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        line = process.stdout.readline()
        if not line.startswith("sunroom service listening on "):
            raise RuntimeError(f"sunroom serve did not start (exit {process.wait(30)}): {line!r}")
        url = line.rsplit(" ", 1)[-1].strip()
        _wait_healthy(url)
        yield Server(url=url, token=full_env["SUNROOM_TOKEN"], process=process)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(stop_timeout)
        process.stdout.close()


def _wait_healthy(url: str) -> None:
    with httpx.Client(base_url=url) as http:
        for _ in range(200):
            try:
                http.get("/healthz")
                return
            except httpx.TransportError:
                time.sleep(0.05)
    raise RuntimeError(f"sunroom serve at {url} did not answer /healthz within 10 s")
