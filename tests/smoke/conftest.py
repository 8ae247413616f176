"""The smoke suite: sunroom as a user installs it, outside this checkout.

``python -m build`` makes the sdist and the wheel; each venv is made from the system
interpreter (readable by the unprivileged uids kernels run as) in a fresh directory under the
system temp dir, and the wheel is installed into it from the package index like any project
would. ``core`` has no extra; ``extras`` has ``[docker,providers,service]``. The tests run the
installed ``sunroom`` and ``python`` of those venvs, never this checkout's code, with the
checkout off ``sys.path``.

``bash scripts/test.sh --smoke`` runs this suite alone and prints how long the install and the
first bwrap kernel took (docs/testing.md).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
TIMINGS: dict[str, float] = {}
"""Figures the suite reports at the end (seconds), by what was timed."""


@dataclass(frozen=True)
class Venv:
    """A venv outside the checkout with the built wheel installed."""

    root: Path
    env: dict[str, str] = field(repr=False)

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def sunroom(self) -> str:
        return str(self.root / "bin" / "sunroom")

    def run(
        self, *args: str, cwd: Path, stdin: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run *args* (a venv command first) in *cwd* with this venv's environment."""
        return subprocess.run(
            list(args), cwd=cwd, env=self.env, input=stdin, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip


def _world_readable_dir(prefix: str) -> Path:
    """A fresh directory under the system temp dir that kernels' uids can traverse."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    return path


def _clean_env(root: Path) -> dict[str, str]:
    """The environment of a user's shell with *root* activated: nothing of this checkout."""
    keep = ("HOME", "LANG", "LC_ALL", "TERM", "USER", "PIP_INDEX_URL", "PIP_FIND_LINKS",
            "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE", "DOCKER_HOST")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = f"{root / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    env["VIRTUAL_ENV"] = str(root)
    env["NO_COLOR"] = "1"
    env["COLUMNS"] = "100"
    return env


@pytest.fixture(scope="session")
def dist() -> Iterator[Path]:
    """The sdist and the wheel, built by ``python -m build`` from the checkout."""
    out = _world_readable_dir("sunroom-dist-")
    # build from a private copy of what the sdist holds: setuptools writes its release tree,
    # build/ and the egg-info into the source directory, which other processes share
    source = out / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(CHECKOUT / name, source / name)
    shutil.copytree(
        CHECKOUT / "sunroom",
        source / "sunroom",
        ignore=shutil.ignore_patterns("__pycache__", "sunroom-watch"),  # the build makes its own
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(source)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    TIMINGS["build sdist + wheel"] = time.monotonic() - started
    yield out
    shutil.rmtree(out, ignore_errors=True)


def _venv(dist: Path, name: str, extras: str) -> Iterator[Venv]:
    root = _world_readable_dir(f"sunroom-{name}-") / "venv"
    env = _clean_env(root)
    (wheel,) = dist.glob("sunroom-*.whl")
    started = time.monotonic()
    # the system interpreter: /root's pyenvs are unreadable to the uids kernels run as
    base = getattr(sys, "_base_executable", sys.executable)
    made = subprocess.run(
        [base, "-m", "venv", str(root)], capture_output=True, text=True, timeout=120, check=False
    )
    assert made.returncode == 0, made.stderr
    pip = subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}{extras}"],
        capture_output=True, text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    TIMINGS[f"fresh venv + pip install wheel{extras}"] = time.monotonic() - started
    yield Venv(root, env)
    shutil.rmtree(root.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def core(dist: Path) -> Iterator[Venv]:
    """The wheel with no extra: bwrap and subprocess kernels, sessions and the CLI."""
    yield from _venv(dist, "core", "")


@pytest.fixture(scope="session")
def extras(dist: Path) -> Iterator[Venv]:
    """The wheel with ``[docker,providers,service]``."""
    yield from _venv(dist, "extras", "[docker,providers,service]")


@pytest.fixture
def workdir() -> Iterator[Path]:
    """An empty directory outside the checkout, as a user's project would be."""
    path = _world_readable_dir("sunroom-project-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the smoke suite's timings (only in the process that ran it: not under xdist)."""
    if TIMINGS:
        terminalreporter.section("smoke timings (this machine)")
        for what, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{what}: {seconds:.1f} s")
