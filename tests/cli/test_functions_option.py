"""``--functions MODULE:ATTR`` on ``sunroom run``: host functions from the user's own project.

Run as a console script runs it: ``python -P`` keeps the current directory off ``sys.path``
(a console script's ``sys.path`` starts with its bin directory), and sunroom comes from this
checkout through ``PYTHONPATH``. Before, ``run`` had no ``--functions`` and
``SUNROOM_FUNCTIONS=mytools:add`` failed with "No module named 'mytools'" unless
``PYTHONPATH=.`` was set (issue 28, item 5).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import sunroom

CHECKOUT = str(Path(sunroom.__file__).resolve().parents[1])

TOOLS = """\
from sunroom import host_function


def add(a: int, b: int) -> int:
    return a + b


@host_function(name="mul")
def times(a: int, b: int) -> int:
    return a * b


TOOLS = [add, times]
"""


def _cli(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sunroom ARGS`` in *project*, its current directory not on ``sys.path`` by itself."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SUNROOM_")}
    base.update(PYTHONPATH=CHECKOUT, SUNROOM_DB=str(project / "s.db"), COLUMNS="100")
    base.update(env or {})
    return subprocess.run(
        [sys.executable, "-P", "-m", "sunroom.cli", *args],
        cwd=project, capture_output=True, text=True, env=base, timeout=120,
    )  # fmt: skip


def _run(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return _cli(
        project, "run", "go", "--model", "scripted:script.json", "--backend", "subprocess", *args,
        env=env,
    )  # fmt: skip


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder: a module of host functions and a scripted model that calls them."""
    (tmp_path / "mytools.py").write_text(TOOLS)
    script = {"replies": [{"code": "print(add(2, 3), mul(4, 5))"}, "done"], "sub_reply": "ok"}
    (tmp_path / "script.json").write_text(json.dumps(script))
    return tmp_path


def test_run_functions_loads_a_list_from_the_current_directory(project: Path) -> None:
    proc = _run(project, "--functions", "mytools:TOOLS", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "success"
    shown = _cli(project, "sessions", "show", json.loads(proc.stdout)["session_id"])
    assert "5 20" in shown.stdout, shown.stdout


def test_run_functions_is_repeatable_and_takes_single_functions(project: Path) -> None:
    script = {"replies": [{"code": "print(add(2, 3))"}, "done"], "sub_reply": "ok"}
    (project / "script.json").write_text(json.dumps(script))
    proc = _run(project, "--functions", "mytools:add", "--functions", "mytools:times")
    assert proc.returncode == 0, proc.stderr
    assert "5" in proc.stdout and "success" in proc.stdout


def test_the_env_var_finds_the_current_directory_too(project: Path) -> None:
    proc = _run(project, "--json", env={"SUNROOM_FUNCTIONS": "mytools:TOOLS"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "success"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nosuchmodule:x", "there is no module 'nosuchmodule' on the path"),
        ("mytools:nope", "module 'mytools' has no 'nope'"),
        ("mytools", "expected module:attribute"),
    ],
)
def test_an_unknown_module_or_attribute_is_one_usage_error(
    project: Path, spec: str, says: str
) -> None:
    proc = _run(project, "--functions", spec)
    assert proc.returncode == 2
    assert proc.stderr == f"sunroom: host functions {spec!r}: {says}\n"
    assert json.loads(_cli(project, "sessions", "list", "--json").stdout) == []  # nothing recorded
