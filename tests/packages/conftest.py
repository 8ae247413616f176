"""Fixtures of the packages tests: backends whose kernels install, and wheelhouses."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _require, backends_under_test
from tests.packages.wheels import real_wheelhouse

INSTALL_BACKENDS = backends_under_test(("subprocess", "bwrap", "docker"))


@pytest.fixture(params=INSTALL_BACKENDS)
def install_backend(request: pytest.FixtureRequest) -> str:
    """The backends with a writable site dir (checked before any loop runs)."""
    return _require(request.param)


@pytest.fixture
def wheelhouse() -> Path:
    """The directory of real downloaded wheels (tabulate, toolz)."""
    return real_wheelhouse()


@pytest.fixture
def built_dir() -> Iterator[Path]:
    """An empty wheelhouse for wheels a test builds, readable by a kernel's own uid."""
    path = Path(tempfile.mkdtemp(prefix="sunroom-test-wheels-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=backends_under_test(("subprocess", "bwrap")))
def local_backend(request: pytest.FixtureRequest) -> str:
    """subprocess and bwrap: a size check after pip, and a tmpfs that fills up."""
    return _require(request.param)
