"""The offline variants of the examples run to a successful end (``--fake``, subprocess backend)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    ("script", "expect"),
    [
        ("chart_analysis.py", "I was shown a 600x300 bar chart"),
        ("analysis_csv.py", "top_region="),
    ],
)
def test_an_example_runs_offline(script: str, expect: str) -> None:
    done = subprocess.run(
        [sys.executable, script, "--fake", "--backend", "subprocess"],
        cwd=EXAMPLES,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "status=success" in done.stdout, done.stdout[-2000:]
    assert expect in done.stdout
