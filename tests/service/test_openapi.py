"""``/openapi.json``: a valid OpenAPI 3.1 document of every route (the E2B facade's too), behind
the token."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pydantic
import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

from sunroom.providers import ScriptedModel
from sunroom.service import ServiceConfig, create_app
from sunroom.service.e2b import schemas as e
from sunroom.service.e2b.catalog import FACADE_ROUTES
from sunroom.service.openapi import OPERATIONS, facade_paths, openapi_document, openapi_path
from sunroom.service.schemas import ProblemOut
from tests.service.conftest import TOKEN, Server, code


def _served_routes(tmp_path: Path) -> set[tuple[str, str]]:
    """(METHOD, OpenAPI path) of every API route the app serves (HEAD is GET's, added by
    Starlette). The web view's routes (``/`` and ``/ui/*``: the page and what only it calls)
    are not the API, so the document leaves them out: the app is built without them here.
    """
    app = create_app(ServiceConfig(token=TOKEN, db_path=tmp_path / "routes.db", ui=False))
    out = set()
    for route in app.routes:
        assert isinstance(route, Route), route
        for method in route.methods or ():
            if method != "HEAD":
                out.add((method, openapi_path(route.path)))
    return out


def _described(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}


FACADE = {(method, p) for path, method in FACADE_ROUTES for p in facade_paths(path)}
"""(METHOD, OpenAPI path) of every route of the E2B facade."""


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
    assert _described(document) == served | FACADE


def test_the_document_needs_the_token_as_every_route_but_the_probes(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    refused = server.anon.get("/openapi.json")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "Unauthorized"
    document = server.client.get("/openapi.json").json()
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert document["paths"]["/readyz"]["get"]["security"] == []
    assert server.anon.get("/readyz").json() == {"ready": True}
    assert document["security"] == [{"bearer": []}]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    protected = [
        op
        for p, ops in document["paths"].items()
        if p not in ("/healthz", "/readyz")
        for op in ops.values()
        if op.get("tags") != ["e2b"]
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
    assert {p["name"] for p in events["parameters"]} == {"sid", "after", "follow", "Last-Event-ID"}
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


# -- the E2B facade


def test_every_facade_route_is_described_with_e2b_credentials() -> None:
    document = openapi_document([], version="0", facade_routes=FACADE_ROUTES)
    validate(document)
    assert _described(document) == FACADE
    assert "/e2b" in document["tags"][0]["description"]  # every facade route answers there too
    schemes = document["components"]["securitySchemes"]
    assert schemes["e2bApiKey"] == {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-KEY",
        "description": schemes["e2bApiKey"]["description"],
    }
    assert schemes["e2bAccessToken"]["name"] == "X-Access-Token"
    assert schemes["e2bTrafficToken"]["name"] == "E2B-Traffic-Access-Token"
    for method, path in FACADE:
        op = document["paths"][path][method.lower()]
        assert op["tags"] == ["e2b"], (method, path)
        assert "401" in op["responses"], (method, path)
        headers = {p["name"]: p for p in op.get("parameters", ()) if p["in"] == "header"}
        if path.startswith(("/sandboxes", "/v2/", "/v3/", "/templates", "/snapshots", "/vol",
                            "/secrets")):  # fmt: skip
            assert op["security"] == [{"e2bApiKey": []}, {"bearer": []}], (method, path)
            assert "E2b-Sandbox-Id" not in headers
        else:  # a sandbox's own route
            assert {"e2bAccessToken": []} in op["security"], (method, path)
            assert headers["E2b-Sandbox-Id"]["required"] is True, (method, path)
    uncovered = document["paths"]["/sandboxes/{sid}/{rest}"]
    assert set(uncovered) == {"get", "post", "put", "patch", "delete"}
    assert all(set(op["responses"]) == {"400", "401", "501"} for op in uncovered.values())
    execute = document["paths"]["/execute"]["post"]["responses"]["200"]["content"]
    assert execute["application/x-ndjson"]["x-line-schema"] == {
        "$ref": "#/components/schemas/ExecuteLine"
    }


class _Facade:
    """Checks real answers of the facade against the schemas the served document names."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.checked: list[str] = []

    def schema(self, method: str, path: str, status: int) -> dict[str, Any]:
        response = self.document["paths"][path][method.lower()]["responses"][str(status)]
        media = response["content"]
        json_like = media.get("application/json") or media["application/x-ndjson"]
        ref = json_like.get("x-line-schema") or json_like["schema"]
        # resolve "#/components/..." against the document
        return {**ref, "components": self.document["components"]}

    def check(self, method: str, path: str, answer: httpx.Response, status: int) -> Any:
        assert answer.status_code == status, answer.text
        schema = self.schema(method, path, status)
        if "x-ndjson" in answer.headers["content-type"]:
            lines = [json.loads(line) for line in answer.text.splitlines()]
            for line in lines:
                jsonschema.validate(line, schema, cls=jsonschema.Draft202012Validator)
            body: Any = lines
        else:
            body = answer.json()
            jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
        self.checked.append(f"{method} {path} {status}")
        return body


def test_real_facade_answers_match_the_served_document(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(backend="bwrap")
    facade = _Facade(server.client.get("/openapi.json").json())
    api = httpx.Client(base_url=server.url, headers={"X-API-KEY": TOKEN}, timeout=60)
    with api:
        created = facade.check(
            "POST", "/v2/sandboxes",
            api.post("/v2/sandboxes", json={"templateID": "base", "metadata": {"k": "v"}}), 201,
        )  # fmt: skip
        assert e.CreatedSandbox.model_validate(created).envdAccessToken
        sid = created["sandboxID"]
        listed = facade.check("GET", "/v2/sandboxes", api.get("/v2/sandboxes"), 200)
        assert [s["sandboxID"] for s in listed] == [sid]
        assert e.ListedSandboxes.model_validate(listed).root[0].metadata == {"k": "v"}
        under = api.get("/e2b/v2/sandboxes")  # the same route under /e2b
        assert facade.check("GET", "/v2/sandboxes", under, 200) == listed
        detail = facade.check("GET", "/sandboxes/{sid}", api.get(f"/sandboxes/{sid}"), 200)
        assert _undescribed(e.SandboxDetail.model_validate(detail)) == []
        facade.check("GET", "/sandboxes/{sid}", api.get("/sandboxes/nope"), 404)
        pause = api.post(f"/sandboxes/{sid}/pause")
        facade.check("POST", "/sandboxes/{sid}/{rest}", pause, 501)

        sandbox = {
            "E2b-Sandbox-Id": sid,
            "E2b-Sandbox-Port": "49999",
            "X-Access-Token": created["envdAccessToken"],
        }
        ctx = facade.check(
            "POST", "/contexts", api.post("/contexts", headers=sandbox, json={}), 200
        )  # fmt: skip
        assert _undescribed(e.CodeContext.model_validate(ctx)) == []
        cell = "print('a')\ndisplay({'k': 1})\n{'v': 2}\n"
        run = api.post("/execute", headers=sandbox, json={"code": cell, "context_id": ctx["id"]})
        lines = facade.check("POST", "/execute", run, 200)
        types = [line["type"] for line in lines]
        assert types[0] == "stdout" and types[-2:] == ["number_of_executions", "end_of_execution"]
        assert "result" in types
        failed = api.post("/execute", headers=sandbox, json={"code": "1 / 0"})
        error = facade.check("POST", "/execute", failed, 200)
        assert [x for x in error if x["type"] == "error"][0]["name"] == "ZeroDivisionError"
        for line in [*lines, *error]:
            assert _undescribed(e.ExecuteLine.model_validate(line).root) == []
        contexts = facade.check("GET", "/contexts", api.get("/contexts", headers=sandbox), 200)
        assert ctx["id"] in [c["id"] for c in contexts]
        assert api.delete(f"/sandboxes/{sid}").status_code == 204
    assert len(facade.checked) == 10


def test_real_envd_answers_match_the_served_document(make_server: Callable[..., Server]) -> None:
    server = make_server(backend="bwrap")
    facade = _Facade(server.client.get("/openapi.json").json())
    with httpx.Client(base_url=server.url, headers={"X-API-KEY": TOKEN}, timeout=60) as api:
        created = api.post("/sandboxes", json={"templateID": "base"}).json()
        files = httpx.Client(
            base_url=server.url,
            timeout=60,
            headers={
                "E2b-Sandbox-Id": created["sandboxID"],
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": created["envdAccessToken"],
            },
        )
        with files:
            upload = files.post("/files", params={"path": "d/a.txt"}, files={"file": b"hi"})
            written = facade.check("POST", "/files", upload, 200)
            assert [w["type"] for w in written] == ["file"]
            assert files.get("/files", params={"path": "d/a.txt"}).content == b"hi"
            missing = files.get("/files", params={"path": "nope.txt"})
            facade.check("GET", "/files", missing, 404)
            rpc = "/filesystem.Filesystem/"
            listed = files.post(rpc + "ListDir", json={"path": "d", "depth": 1})
            entries = facade.check("POST", rpc + "ListDir", listed, 200)["entries"]
            assert [x["name"] for x in entries] == ["a.txt"]
            stat = files.post(rpc + "Stat", json={"path": "d/a.txt"})
            assert (
                facade.check("POST", rpc + "Stat", stat, 200)["entry"]["type"] == "FILE_TYPE_FILE"
            )
            gone = files.post(rpc + "Stat", json={"path": "nope.txt"})
            assert facade.check("POST", rpc + "Stat", gone, 404)["code"] == "not_found"
            removed = files.post(rpc + "Remove", json={"path": "d/a.txt"})
            assert facade.check("POST", rpc + "Remove", removed, 200) == {}
            move = files.post(rpc + "Move", json={"source": "a", "destination": "b"})
            facade.check("POST", rpc + "{method}", move, 501)
            run = files.post("/process.Process/Start", json={})
            facade.check("POST", "/process.Process/{method}", run, 501)
        api.delete(f"/sandboxes/{created['sandboxID']}")
    assert len(facade.checked) == 8
