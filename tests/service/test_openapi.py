"""``/openapi.json``: a valid OpenAPI 3.1 document of every route, behind the token."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

from sunroom.service import ServiceConfig, create_app
from sunroom.service.openapi import openapi_document, openapi_path
from tests.service.conftest import TOKEN, Server


def _served_routes(tmp_path: Path) -> set[tuple[str, str]]:
    """(METHOD, OpenAPI path) of every route the app serves (HEAD is GET's, added by Starlette)."""
    app = create_app(ServiceConfig(token=TOKEN, db_path=tmp_path / "routes.db"))
    out = set()
    for route in app.routes:
        assert isinstance(route, Route), route
        for method in route.methods or ():
            if method != "HEAD":
                out.add((method, openapi_path(route.path)))
    return out


def _described(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}


def test_the_served_document_is_valid_openapi_31_and_describes_every_route(
    make_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = make_server()
    answer = server.client.get("/openapi.json")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    document = answer.json()
    validate(document)  # raises OpenAPIValidationError naming the first fault
    assert document["openapi"] == "3.1.0"
    served = _served_routes(tmp_path)
    assert ("GET", "/openapi.json") in served
    assert _described(document) == served


def test_the_document_needs_the_token_as_every_route_but_healthz(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    refused = server.anon.get("/openapi.json")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "Unauthorized"
    document = server.client.get("/openapi.json").json()
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert document["security"] == [{"bearer": []}]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    protected = [
        op for p, ops in document["paths"].items() if p != "/healthz" for op in ops.values()
    ]
    assert all("security" not in op and "401" in op["responses"] for op in protected)


def test_a_route_without_a_description_is_refused() -> None:
    with pytest.raises(LookupError, match="GET /kernels/{kid}/secrets has no description"):
        openapi_document([("/kernels/{kid}/secrets", "GET")], version="0")


def test_streams_errors_and_bodies_are_described() -> None:
    routes = [("/sessions/{sid}/events", "GET"), ("/kernels/{kid}/files/{path:path}", "PUT"),
              ("/kernels/{kid}/execute", "POST")]  # fmt: skip
    document = openapi_document(routes, version="0")
    events = document["paths"]["/sessions/{sid}/events"]["get"]
    assert list(events["responses"]["200"]["content"]) == ["text/event-stream"]
    assert {p["name"] for p in events["parameters"]} == {"sid", "after", "Last-Event-ID"}
    put = document["paths"]["/kernels/{kid}/files/{path}"]["put"]
    assert list(put["requestBody"]["content"]) == ["application/octet-stream"]
    execute = document["paths"]["/kernels/{kid}/execute"]["post"]
    problem = {"$ref": "#/components/schemas/ProblemOut"}
    assert execute["responses"]["404"]["content"]["application/json"]["schema"] == problem
    assert execute["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Execute"
    }
    schemas = document["components"]["schemas"]
    assert schemas["ProblemOut"]["required"] == ["error"]
    assert set(schemas["ExecutionOut"]["required"]) >= {"status", "stdout", "error", "outputs"}
