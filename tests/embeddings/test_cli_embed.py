"""``sunroom embed``: the real test model (all-MiniLM-L6-v2 built as ONNX), run as a command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

SENTENCES = [
    "A man is eating food.",
    "",
    "A man is riding a horse.",
    "The new movie is awesome.",
    "A cheetah is running behind its prey.",
]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "embed", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(SENTENCES) + "\n")
    return path


def test_vectors_as_json_match_the_embedder(texts: Path, model_dir: Path, embedder: Any) -> None:
    proc = run(str(texts), "--model", str(model_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["dim"] == 384 and out["truncated"] == []
    assert [v["line"] for v in out["vectors"]] == [1, 3, 4, 5]  # blank line 2 skipped
    got = np.array([v["vector"] for v in out["vectors"]], dtype=np.float32)
    want = embedder.embed([s for s in SENTENCES if s]).vectors
    assert np.abs(got - want).max() < 1e-5


def test_plain_vectors_are_one_line_per_text(texts: Path, model_dir: Path) -> None:
    proc = run(str(texts), "--model", str(model_dir))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["1", "3", "4", "5"]
    assert all(len(line.split("\t")[1].split(" ")) == 384 for line in lines)


def test_query_prints_the_top_k_best_first(texts: Path, model_dir: Path) -> None:
    proc = run(str(texts), "--model", str(model_dir), "--query", "someone on a horse", "--k", "2")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert len(rows) == 2
    assert rows[0][1:] == ["3", "A man is riding a horse."]
    assert float(rows[0][0]) > float(rows[1][0]) > -1.0
    js = run(str(texts), "--model", str(model_dir), "--query", "a film", "--k", "1", "--json")
    hits = json.loads(js.stdout)["hits"]
    assert hits[0]["line"] == 4 and hits[0]["text"] == "The new movie is awesome."


def test_stdin_and_query_kind(model_dir: Path) -> None:
    doc = run("-", "--model", str(model_dir), "--json", stdin="hello world\n")
    query = run("-", "--model", str(model_dir), "--json", "--kind", "query", stdin="hello world\n")
    assert doc.returncode == query.returncode == 0, doc.stderr + query.stderr
    # MiniLM has no prefixes: a query and a document of the same text embed the same
    assert json.loads(doc.stdout)["vectors"] == json.loads(query.stdout)["vectors"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--kind", "passage"], "--kind must be document or query"),
        (["--k", "0", "--query", "x"], "--k must be at least 1"),
    ],
)
def test_bad_options_exit_2(texts: Path, model_dir: Path, args: list[str], words: str) -> None:
    proc = run(str(texts), "--model", str(model_dir), *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("sunroom: ") and words in proc.stderr


def test_bad_files_and_models_exit_2_with_one_line(tmp_path: Path, texts: Path) -> None:
    missing = run(str(tmp_path / "nope.txt"), "--model", str(tmp_path))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    empty = run(str(blank), "--model", str(tmp_path))
    assert empty.returncode == 2 and "no text to embed" in empty.stderr
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    assert "not UTF-8" in run(str(binary), "--model", str(tmp_path)).stderr
    no_model = run(str(texts), "--model", str(tmp_path / "no-model"))
    assert no_model.returncode == 2
    assert no_model.stderr.startswith("sunroom: ") and len(no_model.stderr.splitlines()) == 1
    assert "Traceback" not in no_model.stderr
