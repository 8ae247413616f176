"""``/openapi.json``: a valid OpenAPI 3.1 document of every route, behind the token."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

from sunroom.providers import ScriptedModel
from sunroom.service import ServiceConfig, create_app
from sunroom.service.openapi import OPERATIONS, openapi_document, openapi_path
from sunroom.service.schemas import ProblemOut
from tests.service.conftest import TOKEN, Server, code


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


def _undescribed(value: object, where: str = "") -> list[str]:
    """Fields of *value* (a parsed response model) that its model does not name."""
    if isinstance(value, pydantic.BaseModel):
        out = [f"{where}.{k}" for k in value.model_extra or {}]
        for name in type(value).model_fields:
            out += _undescribed(getattr(value, name), f"{where}.{name}")
        return out
    if isinstance(value, list):
        return [x for i, item in enumerate(value) for x in _undescribed(item, f"{where}[{i}]")]
    return []


def test_every_json_answer_is_the_described_model_and_nothing_more(
    make_server: Callable[..., Server],
) -> None:
    """Each route's real answer parses as the model the document names, with no extra field."""
    server = make_server(ScriptedModel([code("print(6 * 7)"), "forty-two"]))
    http = server.client
    checked: list[str] = []

    def check(method: str, path: str, answer: httpx.Response) -> Any:
        op = OPERATIONS[(method, path)]
        model = op.answers.get(answer.status_code, ProblemOut)
        assert model is not None, (method, path, answer.status_code)
        parsed = model.model_validate_json(answer.content)
        assert _undescribed(parsed) == [], (method, path)
        checked.append(f"{method} {path} {answer.status_code}")
        return answer.json()

    check("GET", "/healthz", http.get("/healthz"))
    sid = check("POST", "/sessions", http.post("/sessions", json={"task": "go"}))["session_id"]
    result = http.get(f"/sessions/{sid}/result", params={"timeout": 30})
    assert check("GET", "/sessions/{sid}/result", result)["status"] == "finished"
    check("GET", "/sessions", http.get("/sessions"))
    check("GET", "/sessions/{sid}", http.get(f"/sessions/{sid}"))
    check("GET", "/sessions/{sid}/approvals", http.get(f"/sessions/{sid}/approvals"))
    no_call = http.post(f"/sessions/{sid}/approvals/nope", json={"allow": True})
    assert no_call.status_code == 404
    check("POST", "/sessions/{sid}/approvals/{call_id}", no_call)
    check("GET", "/sessions/{sid}/files", http.get(f"/sessions/{sid}/files"))
    kid = check("POST", "/kernels", http.post("/kernels", json={}))["kernel_id"]
    cell = "display({'a': 1})\nprint('x')\n1 / 0"  # an output, stdout and an error
    check(
        "POST", "/kernels/{kid}/execute", http.post(f"/kernels/{kid}/execute", json={"code": cell})
    )
    check(
        "POST", "/kernels/{kid}/execute", http.post(f"/kernels/{kid}/execute", json={"code": "1"})
    )
    written = http.put(f"/kernels/{kid}/files/a/b.txt", content=b"hi")
    check("PUT", "/kernels/{kid}/files/{path}", written)
    check("GET", "/kernels/{kid}/files", http.get(f"/kernels/{kid}/files"))
    check("DELETE", "/kernels/{kid}/files/{path}", http.delete(f"/kernels/{kid}/files/a/b.txt"))
    copies = check("POST", "/kernels/{kid}/fork", http.post(f"/kernels/{kid}/fork", json={"n": 1}))
    check("GET", "/kernels", http.get("/kernels"))
    check("GET", "/kernels/{kid}", http.get(f"/kernels/{kid}"))
    for each in [kid, *copies["kernel_ids"]]:
        check("DELETE", "/kernels/{kid}", http.delete(f"/kernels/{each}"))
    check("GET", "/kernels/{kid}", http.get(f"/kernels/{kid}"))  # 404 now: the error body
    check(
        "POST",
        "/sessions/{sid}/messages",
        http.post(f"/sessions/{sid}/messages", json={"text": "more"}),
    )
    check("DELETE", "/sessions/{sid}", http.delete(f"/sessions/{sid}"))
    assert len(checked) == 22
