"""``sunroom eval``: a fake run's files and table, usage errors, resume, and no matplotlib."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from sunroom.cli import app
from sunroom.cli.eval import parse_lengths

ROOT = Path(__file__).resolve().parents[2]
FAST = ("--backend", "subprocess", "--no-progress")


def _invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["eval", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def test_a_fake_run_writes_the_three_files_and_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = _invoke(
        "--fake", "--tasks", "niah,oolong-pairs", "--lengths", "4k", "--seeds", "2",
        "--arms", "long-prompt,rlm-no-sub,rlm,best-of-k", "--parallel", "2", "--out", str(out),
        "--backend", "subprocess",
    )  # fmt: skip
    assert code == 0, stderr
    assert "] 16/16 runs  score 1.00  cost 0 µUSD (+16 unpriced)" in stderr  # the progress bar
    assert stdout.startswith("# sunroom eval: fake-root (sub: fake-sub)")
    assert "| niah         | 4K     | best-of-k   | 2 |    1.00 [0.34, 1.00] |" in stdout
    assert stdout.rstrip().endswith(
        f"16 runs; wrote {out}/results.json, {out}/table.md, {out}/plot.png"
    )
    data = json.loads((out / "results.json").read_text())
    assert [c["n"] for c in data["summary"]] == [2] * 8
    assert (out / "table.md").read_text() in stdout
    # the same command again is refused; with --resume and more seeds only the new ones run
    code, _, stderr = _invoke(
        "--fake", "--tasks", "niah", "--lengths", "4k", "--out", str(out), *FAST
    )
    assert code == 2 and "already exists: resume it (--resume)" in stderr
    code, stdout, stderr = _invoke(
        "--fake", "--tasks", "niah", "--lengths", "4k", "--seeds", "3", "--arms", "long-prompt",
        "--out", str(out), "--resume", *FAST,
    )  # fmt: skip
    assert code == 0, stderr
    assert "17 runs; wrote" in stdout


def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    out = str(tmp_path / "o")
    cases = [
        (["--fake"], "give --out DIR"),
        (["--fake", "--out", out, "--tasks", "nope"], "unknown task or arm 'nope'"),
        (["--fake", "--out", out, "--arms", "rlm,nope"], "unknown task or arm 'nope'"),
        (["--fake", "--out", out, "--lengths", "8x"], "a length is a number of characters"),
        (["--fake", "--out", out, "--choose", "best"], "--choose is vote or first"),
        (["--fake", "--out", out, "--code-mode", "json"], "--code-mode is tool or fenced"),
        (["--fake", "--out", out, "--k", "1"], "k must be from 2 to 64"),
        (["--out", out, "--fake-error-rate", "0.5"], "--fake-error-rate applies to --fake only"),
        (["--fake", "--out", out, "--tasks", "niah-semantic"], "needs an embedder"),
    ]
    for args, message in cases:
        code, _, stderr = _invoke(*args, *FAST)
        assert code == 2, (args, stderr)
        assert stderr.startswith("sunroom: ") and message in stderr, (args, stderr)
        assert stderr.count("\n") == 1, stderr
    code, _, stderr = _invoke("--out", out, *FAST, env={"SUNROOM_MODEL": None})
    assert code == 2 and "no model: pass --model" in stderr
    assert parse_lengths("8k, 32K,1m,2_500") == [8_000, 32_000, 1_000_000, 2_500]


_HIDE_MATPLOTLIB = """\
import sys

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, Hide())
sys.argv = ["sunroom", *sys.argv[1:]]
from sunroom.cli import main
main()
"""


def test_without_matplotlib_everything_but_the_plot_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["eval", "--fake", "--tasks", "niah", "--lengths", "4k", "--seeds", "2", "--arms",
            "long-prompt", "--out", str(out), *FAST]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _HIDE_MATPLOTLIB, *args], capture_output=True, text=True,
        cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        "sunroom: plot.png was skipped because matplotlib is missing; install it with pip "
        "install 'sunroom[eval]' (results.json and table.md were written)\n"
    )
    assert (out / "results.json").exists() and (out / "table.md").exists()
    assert not (out / "plot.png").exists()
    assert "wrote" in done.stdout and "plot.png" not in done.stdout
