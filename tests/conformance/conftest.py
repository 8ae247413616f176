"""Fixtures of the fork and template conformance cases."""

from __future__ import annotations

import pytest

from sunroom.sandbox.watcher import ENV_CHOICE
from tests.conftest import _require, backends_under_test

FORK_BACKENDS = backends_under_test(("subprocess", "bwrap", "docker"))
PYTHON_WATCHED = [f"{b}+python-watcher" for b in FORK_BACKENDS if b in ("subprocess", "bwrap")]
"""The same cases once more with the Python watcher (``SUNROOM_WATCHER=python``): it and the
compiled one, the default, carry out one contract (sunroom.prelude.watch)."""


@pytest.fixture(params=FORK_BACKENDS + PYTHON_WATCHED)
def fork_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The backends whose kernels fork (checked before any loop runs), each with the default
    (compiled) watcher and, for subprocess and bwrap, with the Python one too."""
    name, _, watcher = str(request.param).partition("+")
    if watcher:
        monkeypatch.setenv(ENV_CHOICE, "python")
    else:
        monkeypatch.delenv(ENV_CHOICE, raising=False)
    return _require(name)
