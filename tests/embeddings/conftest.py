"""Fixtures: the real test model's directory and one embedder shared by a module's tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sunroom.embeddings import OnnxEmbedder
from tests.embeddings import testmodel


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """all-MiniLM-L6-v2 as model.onnx + tokenizer.json + configs (built once, cached)."""
    return testmodel.model_dir()


@pytest.fixture(scope="module")
def embedder(model_dir: Path) -> Iterator[OnnxEmbedder]:
    emb = OnnxEmbedder(model_dir)
    yield emb
    emb.close()


def copy_model(src: Path, dest: Path, *, skip: tuple[str, ...] = ()) -> Path:
    """A copy of a model directory (files hard-linked when possible), minus ``skip``.

    To change a file, skip it and write a new one: never write into a linked file.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for path in src.rglob("*"):
        rel = path.relative_to(src).as_posix()
        target = dest / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if rel in skip or rel == ".complete":
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.hardlink_to(path)
        except OSError:
            shutil.copyfile(path, target)
    return dest
