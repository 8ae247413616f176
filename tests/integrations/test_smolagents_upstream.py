"""smolagents' own ``CommonDockerExecutorIntegration`` tests, unmodified, on ``SunroomExecutor``.

At test time the sdist of the installed smolagents is downloaded from PyPI (once: it is cached
under the virtualenv's ``cache/upstream``), its ``tests/test_remote_executors.py`` is extracted
unchanged into a temporary package, and a pytest subprocess runs the upstream class through a
subclass whose ``custom_executor`` fixture (the fixture the upstream class asks for) returns a
``SunroomExecutor``, exactly as upstream's Docker and Modal classes return theirs. The sdist
lacks the ``tests/__init__.py`` and ``tests/utils/markers.py`` that file imports; the harness
writes its own minimal ones below. Nothing of smolagents' is stored in this repository.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tarfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import sunroom

pytestmark = pytest.mark.kernel

VERSION = importlib.metadata.version("smolagents")
CACHE = Path(sys.prefix) / "cache" / "upstream"
UPSTREAM_FILE = "tests/test_remote_executors.py"

#: the harness's own modules of the temporary ``tests`` package (not copies of smolagents')
MARKERS = '''\
"""The one marker test_remote_executors.py imports; the harness runs every class it selects."""

import pytest

require_run_all = pytest.mark.require_run_all
'''

SUBCLASS = '''\
"""The upstream class with its executor fixture pointed at sunroom."""

import io

import pytest
from rich.console import Console
from smolagents.monitoring import AgentLogger, LogLevel

from sunroom.integrations.smolagents import SunroomExecutor

from .test_remote_executors import CommonDockerExecutorIntegration


class TestSunroomExecutorIntegration(CommonDockerExecutorIntegration):
    @pytest.fixture
    def custom_executor(self):
        executor = SunroomExecutor(
            additional_imports=["pillow", "numpy"],
            logger=AgentLogger(LogLevel.INFO, Console(force_terminal=False, file=io.StringIO())),
            backend="bwrap",
        )
        yield executor
        executor.delete()
'''


def _sdist() -> Path:
    """The installed version's sdist, downloaded once into :data:`CACHE`."""
    target = CACHE / f"smolagents-{VERSION}.tar.gz"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    run = subprocess.run(
        [*download, f"smolagents=={VERSION}", "-d", str(CACHE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and target.exists(), run.stdout + run.stderr
    return target


def _upstream_package(root: Path) -> Path:
    """Lay out ``root/tests`` with the upstream file (unchanged) and the harness's modules."""
    tests = root / "tests"
    (tests / "utils").mkdir(parents=True)
    with tarfile.open(_sdist()) as archive:
        member = archive.getmember(f"smolagents-{VERSION}/{UPSTREAM_FILE}")
        source = archive.extractfile(member)
        assert source is not None
        (tests / "test_remote_executors.py").write_bytes(source.read())
    (tests / "__init__.py").write_text("")
    (tests / "utils" / "__init__.py").write_text("")
    (tests / "utils" / "markers.py").write_text(MARKERS)
    (tests / "test_sunroom_executor.py").write_text(SUBCLASS)
    (root / "pytest.ini").write_text(
        textwrap.dedent("""\
            [pytest]
            markers =
                require_run_all: upstream's marker for tests that need a live service
            """)
    )
    return tests / "test_sunroom_executor.py"


def test_smolagents_common_executor_integration_passes_unmodified_on_sunroom(
    tmp_path: Path,
) -> None:
    subclass = _upstream_package(tmp_path)
    report = tmp_path / "report.xml"
    repo = Path(sunroom.__file__).resolve().parents[1]  # the sunroom under test, not another
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(tmp_path)])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(tmp_path / "pytest.ini"),
            "--rootdir",
            str(tmp_path),
            f"--junitxml={report}",
            str(subclass),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None, run.stdout + run.stderr
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}
    print(f"smolagents {VERSION} CommonDockerExecutorIntegration on sunroom: {counts}")
    assert run.returncode == 0, run.stdout + run.stderr
    # 1.26.0 has 10 cases (8 tests, one parametrized three ways); every one ran and passed
    assert counts["tests"] >= 10, counts
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, counts
