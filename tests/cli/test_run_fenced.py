"""``sunroom run --code-mode fenced`` shows each cell's code once (issue 28, item 9).

Before, the model's reply was printed as written, its ```python block included, and then the
same code again as the cell that ran; ``sessions show`` replayed it the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUNROOM_")}
    env.update(SUNROOM_DB=str(tmp_path / "s.db"), COLUMNS="100")
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip


def test_fenced_code_is_shown_once_as_the_cell(tmp_path: Path) -> None:
    script = [{"text": "Multiplying.", "code": "print(6 * 7)"}, "The answer is 42."]
    (tmp_path / "fenced.json").write_text(json.dumps(script))
    model = f"scripted:{tmp_path / 'fenced.json'}"
    proc = _cli(tmp_path, "run", "6 times 7?", "--model", model, "--code-mode", "fenced",
                "--backend", "subprocess")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for shown in (proc.stdout, _cli(tmp_path, "sessions", "show", _sid(tmp_path)).stdout):
        assert shown.count("print(6 * 7)") == 1, shown
        assert "```" not in shown, shown
        assert shown.count("Multiplying.") == 1, shown
        assert shown.index("Multiplying.") < shown.index("cell · turn 1") < shown.index("\n42\n")


def _sid(tmp_path: Path) -> str:
    listing = json.loads(_cli(tmp_path, "sessions", "list", "--json").stdout)
    sid: str = listing[0]["session_id"]
    return sid
