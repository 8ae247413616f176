"""Fixtures of the fork and template conformance cases."""

from __future__ import annotations

import pytest

from sunroom.sandbox.watcher import ENV_CHOICE
from tests.conftest import _require, backends_under_test

FORK_BACKENDS = backends_under_test(("subprocess", "bwrap", "docker"))
COMPILED_WATCHED = [f"{b}+compiled-watcher" for b in FORK_BACKENDS if b in ("subprocess", "bwrap")]
"""The same cases once more with the compiled watcher (``SUNROOM_WATCHER=compiled``): it and
the Python one carry out one contract (sunroom.prelude.watch)."""


@pytest.fixture(params=FORK_BACKENDS + COMPILED_WATCHED)
def fork_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The backends whose kernels fork (checked before any loop runs), each with the default
    (Python) watcher and, for subprocess and bwrap, with the compiled one too."""
    name, _, watcher = str(request.param).partition("+")
    if watcher:
        monkeypatch.setenv(ENV_CHOICE, "compiled")
    return _require(name)
