"""``POST /sessions`` with an ``output_schema``: every constraint is enforced on the host."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sunroom.providers import ScriptedModel
from tests.service.conftest import Server, code
from tests.service.test_routes import sse

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "count": {"type": "integer", "minimum": 0},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"age": {"type": "integer", "minimum": 0}},
                "required": ["age"],
            },
        },
    },
    "required": ["count", "code"],
    "additionalProperties": False,
}


def test_output_schema_constraints_are_enforced(make_server: Callable[..., Server]) -> None:
    model = ScriptedModel(
        [
            code("submit({'count': -5, 'code': 'ABC'})", 1),
            code("submit({'count': 1, 'code': 'abc'})", 2),
            code("submit({'count': 1, 'code': 'ABC', 'people': [{'age': 1}, {'age': -5}]})", 3),
            code("submit({'count': 1, 'code': 'ABC', 'extra': True})", 4),
            code("submit({'count': 2, 'code': 'XYZ', 'people': [{'age': 40}]})", 5),
        ]
    )
    server = make_server(model)
    r = server.client.post(
        "/sessions",
        json={"task": "count", "preset": "rlm", "output_schema": SCHEMA,
              "inputs": {"doc": "a b c"}, "max_turns": 10},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 30}).json()["result"]
    assert result["status"] == "success", result
    assert result["output"] == {"count": 2, "code": "XYZ", "people": [{"age": 40}]}
    reasons = [e["data"]["reason"] for e in sse(server, sid) if e["event"] == "SubmitRejected"]
    assert len(reasons) == 4, reasons
    assert "output.count: -5 is less than the minimum of 0" in reasons[0]
    assert "output.code: 'abc' does not match '^[A-Z]{3}$'" in reasons[1]
    assert "output.people[1].age: -5 is less than the minimum of 0" in reasons[2]
    assert "('extra' was unexpected)" in reasons[3]


def test_an_invalid_output_schema_is_a_422_naming_the_problem(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(ScriptedModel(["hi"]))
    r = server.client.post("/sessions", json={"output_schema": {"type": "integer", "minimum": "0"}})
    assert r.status_code == 422, r.text
    assert "output_schema.minimum: '0' is not of type 'number'" in r.json()["error"]["message"]
    r = server.client.post("/sessions", json={"output_schema": {"$ref": "file:///etc/passwd"}})
    assert r.status_code == 422 and "remote" in r.json()["error"]["message"]
