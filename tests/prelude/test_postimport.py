"""Patches run right after a module's import (sunroom.prelude.postimport), on real modules."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sunroom.prelude import postimport


@pytest.fixture
def module_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path with a fresh package ``pi_pkg`` (module ``pi_pkg.target``)."""
    package = tmp_path / "pi_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "target.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("pi_pkg.target", "pi_pkg"):
            sys.modules.pop(name, None)


def mark(module: types.ModuleType) -> None:
    module.PATCHED = getattr(module, "PATCHED", 0) + 1  # type: ignore[attr-defined]


def test_a_patch_runs_after_each_import_and_reload_until_removed(module_dir: Path) -> None:
    postimport.after_import("pi_pkg.target", mark)
    postimport.after_import("pi_pkg.target", mark)  # the same patch again: once
    try:
        assert postimport.FINDER in sys.meta_path and "pi_pkg.target" not in sys.modules
        target = importlib.import_module("pi_pkg.target")
        assert target.VALUE == 1 and target.PATCHED == 1
        loader: object = target.__loader__
        assert isinstance(loader, postimport.PatchingLoader)
        source: Any = loader.get_source  # delegated to the module's own loader
        assert source("pi_pkg.target") == "VALUE = 1\n"
        target = importlib.reload(target)
        assert target.PATCHED == 2  # the same module object, its code run again
        del sys.modules["pi_pkg.target"]
        again = importlib.import_module("pi_pkg.target")
        assert again is not target and again.PATCHED == 1
    finally:
        postimport.remove("pi_pkg.target", mark)
    assert postimport.FINDER not in sys.meta_path
    del sys.modules["pi_pkg.target"]
    assert not hasattr(importlib.import_module("pi_pkg.target"), "PATCHED")


def test_a_loaded_module_is_patched_at_once(module_dir: Path) -> None:
    target = importlib.import_module("pi_pkg.target")
    postimport.after_import("pi_pkg.target", mark)
    try:
        assert target.PATCHED == 1
    finally:
        postimport.remove("pi_pkg.target", mark)


def test_a_failing_patch_is_said_and_the_import_goes_on(
    module_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(module: types.ModuleType) -> None:
        raise RuntimeError("no patch today")

    postimport.after_import("pi_pkg.target", broken)
    try:
        assert importlib.import_module("pi_pkg.target").VALUE == 1
    finally:
        postimport.remove("pi_pkg.target", broken)
    err = capsys.readouterr().err
    assert "could not patch pi_pkg.target" in err and "RuntimeError: no patch today" in err


def test_a_module_no_finder_knows_is_still_not_found() -> None:
    postimport.after_import("pi_missing_module", mark)
    try:
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("pi_missing_module")
        assert postimport.FINDER.find_spec("pi_missing_module", None) is None
    finally:
        postimport.remove("pi_missing_module", mark)
