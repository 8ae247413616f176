"""``FACADE_ROUTES`` lists exactly the routes the E2B facade's parts serve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from sunroom.service import ServiceConfig
from sunroom.service.e2b.catalog import FACADE_ROUTES
from sunroom.service.e2b.control import control_routes
from sunroom.service.e2b.envd import EnvdTarget, envd_routes
from sunroom.service.e2b.interpreter import interpreter_routes
from sunroom.service.e2b.sandboxes import Sandbox, Sandboxes
from tests.service.conftest import TOKEN


async def _no_sandbox(request: Request) -> Sandbox:
    raise AssertionError("routes are only listed here, never called")


async def _no_target(request: Request) -> EnvdTarget:
    raise AssertionError("routes are only listed here, never called")


def _served(routes: Sequence[BaseRoute]) -> set[tuple[str, str]]:
    """(path, method) of *routes* (HEAD is GET's, added by Starlette)."""
    out = set()
    for route in routes:
        assert isinstance(route, Route), route
        out |= {(route.path, m) for m in route.methods or () if m != "HEAD"}
    return out


@pytest.fixture
def sandboxes(tmp_path: Path) -> Sandboxes:
    return Sandboxes(config=ServiceConfig(token=TOKEN, db_path=tmp_path / "catalog.db"))


def test_the_catalog_lists_each_route_once() -> None:
    assert len(set(FACADE_ROUTES)) == len(FACADE_ROUTES)


def test_the_catalog_is_what_the_control_plane_and_the_interpreter_serve(
    sandboxes: Sandboxes,
) -> None:
    served = _served(control_routes(sandboxes)) | _served(
        interpreter_routes(sandboxes, _no_sandbox)
    )
    envd_only = {("/files", "GET"), ("/files", "POST")} | {
        r for r in FACADE_ROUTES if r[0].startswith(("/filesystem.", "/process."))
    }
    assert set(FACADE_ROUTES) - envd_only == served


def test_the_catalog_is_what_envd_serves() -> None:
    served = _served(envd_routes(_no_target, max_file_bytes=1 << 20))
    listed = {
        r
        for r in FACADE_ROUTES
        if r[0] in ("/files", "/health") or r[0].startswith(("/filesystem.", "/process."))
    }
    assert served == listed
