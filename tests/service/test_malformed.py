"""Malformed requests: every wrong request is a 4xx with the JSON error shape, never a 5xx.

Numeric fields have documented ranges checked at the edge (docs/service.md, "Limits"); JSON
bodies are parsed with a depth cap; client JSON Schemas are checked with a real validator.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sunroom.errors import KernelStartError
from sunroom.providers import ScriptedModel
from sunroom.service.problems import public_message
from sunroom.service.schemas import RANGES
from tests.service.conftest import TOKEN, Server

LEAKS = ("Traceback", "/home/", "/tmp/", "/work/", "site-packages", 'File "')


def assert_error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    error = r.json()["error"]
    assert set(error) == {"type", "message"}
    for word in words:
        assert word in error["message"], (word, error["message"])
    for leak in LEAKS:
        assert leak not in r.text, (leak, r.text)


def test_list_limit_must_be_a_whole_number_in_range(make_server: Callable[..., Server]) -> None:
    server = make_server()
    for bad in ("abc", "0", "-1", "1001", "1e3", str(10**30)):
        assert_error(server.client.get("/sessions", params={"limit": bad}), 422, "limit", "1000")
    assert server.client.get("/sessions", params={"limit": "1000"}).status_code == 200


def test_a_deeply_nested_body_is_refused(make_server: Callable[..., Server]) -> None:
    server = make_server()
    deep = "[" * 10_000 + "]" * 10_000
    for path in ("/sessions", "/kernels"):
        r = server.client.post(path, content=deep, headers={"content-type": "application/json"})
        assert_error(r, 422, "deep")
    deep_obj = '{"inputs": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"
    assert_error(server.client.post("/kernels", content=deep_obj), 422, "deep")


@pytest.mark.parametrize(
    "schema",
    [{"type": {}}, {"properties": [1, 2]}, {"enum": 5}, {"type": "nope"}, {"minimum": "x"}],
)
def test_an_invalid_output_schema_is_a_422(
    make_server: Callable[..., Server], schema: dict[str, Any]
) -> None:
    server = make_server()
    r = server.client.post("/sessions", json={"output_schema": schema})
    assert_error(r, 422, "output_schema")
    assert server.client.get("/sessions").json()["sessions"] == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_mb", 1e30),
        ("memory_mb", 0),
        ("cpu_s", 1e30),
        ("cpu_s", -1),
        ("pids", 2**63),
        ("pids", 1),  # no kernel starts with fewer than MIN_PIDS: a 422, not a 503
        ("pids", 31),
        ("max_output_bytes", 1e30),
        ("max_output_bytes", 0),
        ("timeout_s", 1e300),
        ("timeout_s", 0),
    ],
)
def test_kernel_limits_out_of_range_are_refused(
    make_server: Callable[..., Server], field: str, value: float
) -> None:
    server = make_server()
    for path in ("/kernels", "/sessions"):
        r = server.client.post(path, json={"limits": {field: value}})
        assert_error(r, 422, f"limits.{field}")
    assert server.client.get("/healthz").json()["kernels"] == 0


def test_infinity_and_nan_are_refused(make_server: Callable[..., Server]) -> None:
    server = make_server()
    for literal in ("1e309", "-1e309", "NaN", "Infinity"):
        body = f'{{"limits": {{"timeout_s": {literal}}}}}'
        assert_error(server.client.post("/kernels", content=body), 422, "timeout_s")
    body = '{"budget": {"max_wall_s": 1e309}}'
    assert_error(server.client.post("/sessions", content=body), 422, "budget.max_wall_s")
    body = '{"budget": {"max_tokens": 1e30}}'
    assert_error(server.client.post("/sessions", content=body), 422, "budget.max_tokens")


def test_execute_timeout_out_of_range_is_refused(make_server: Callable[..., Server]) -> None:
    server = make_server()
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    for literal in ("1e309", "NaN", "1e30", "0", "-1"):
        body = f'{{"code": "1", "timeout_s": {literal}}}'
        r = server.client.post(f"/kernels/{kid}/execute", content=body)
        assert_error(r, 422, "timeout_s")
    r = server.client.post(f"/kernels/{kid}/execute", json={"code": "1 + 1"})
    assert r.status_code == 200 and r.json()["value"] == "2"


def test_result_timeout_and_event_ids_out_of_range_are_refused(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(lambda: ScriptedModel(["done"]))
    sid = server.client.post("/sessions", json={}).json()["session_id"]
    for bad in ("-1", "nan", "inf", "3601", "soon"):
        r = server.client.get(f"/sessions/{sid}/result", params={"timeout": bad})
        assert_error(r, 422, "timeout", "3600")
    for bad in ("9" * 25, "-1", "x"):
        r = server.client.get(f"/sessions/{sid}/events", params={"after": bad})
        assert_error(r, 422, "after")
        r = server.client.get(f"/sessions/{sid}/events", headers={"last-event-id": bad})
        assert_error(r, 422, "Last-Event-ID")


def raw(server: Server, request: bytes, *, timeout: float = 5.0) -> tuple[int, bytes, bytes]:
    """Send *request* on a raw socket; the status, the headers and the body of the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the server may close while a big request is sent
            sock.sendall(request)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, head, body


def test_server_layer_errors_are_json(make_server: Callable[..., Server]) -> None:
    server = make_server()
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    cases = [
        b"GET /sessions/\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth + b"\r\n",
        b"POST /kernels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n" + auth + b"\r\n",
        b"GARBAGE\r\n\r\n",
    ]
    for request in cases:
        status, head, body = raw(server, request)
        assert 400 <= status < 500, (request, head)
        assert b"application/json" in head.lower(), head
        assert set(json.loads(body)["error"]) == {"type", "message"}


@pytest.mark.parametrize("size", [17 * 1024, 70 * 1024, 1024 * 1024])
def test_headers_over_16_kib_are_a_431(make_server: Callable[..., Server], size: int) -> None:
    server = make_server()
    request = (
        f"GET /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Connection: close\r\n"
        f"X-Big: {'a' * size}\r\n\r\n"
    ).encode()
    status, head, body = raw(server, request)
    assert status == 431, head
    assert json.loads(body)["error"]["type"] == "HeadersTooLarge"
    assert server.client.get("/healthz").status_code == 200  # the server is fine


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_FIELDS = {
    "/sessions": ["limits", "budget", "output_schema", "max_turns", "inputs", "preset", "task"],
    "/kernels": ["limits", "inputs", "backend"],
}


def test_fuzzed_bodies_never_get_a_5xx(make_server: Callable[..., Server]) -> None:
    server = make_server(lambda: ScriptedModel(["done"] * 1000), max_sessions=1000)
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    sid = server.client.post("/sessions", json={}).json()["session_id"]
    routes = ["/sessions", "/kernels", f"/sessions/{sid}/messages", f"/kernels/{kid}/execute"]

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @example(path=routes[3], body={"code": "A"})  # a cell that raises: its own traceback
    @given(
        path=st.sampled_from(routes),
        body=st.one_of(
            _json,
            st.fixed_dictionaries(
                {},
                optional={
                    name: _json
                    for name in {f for fields in _FIELDS.values() for f in fields} | {"text"}
                },
            ),
            st.fixed_dictionaries(
                {"code": st.sampled_from(["1", "x = 2", "("]) | _json},
                optional={"timeout_s": _json | st.floats() | st.integers()},
            ),
            st.fixed_dictionaries(
                {
                    "limits": st.fixed_dictionaries(
                        {},
                        optional={
                            k: _json | st.floats() | st.integers()
                            for k in ("timeout_s", "memory_mb", "cpu_s", "pids", "max_output_bytes")
                        },
                    )
                }
            ),
        ),
    )
    def check(path: str, body: Any) -> None:
        text = json.dumps(body)  # NaN/Infinity included: Python's json writes them
        r = server.client.post(path, content=text)
        assert r.status_code < 500, (path, text, r.status_code, r.text)
        shown = r.text
        if path.endswith("/execute") and r.status_code == 200 and r.json()["error"]:
            # code that raised (a fuzzed "A" is a NameError) answers with the cell's own
            # traceback, data the caller asked for: every frame in it is the cell's, none the
            # host's or sunroom's; the rest of the answer is checked as any other
            error = r.json()["error"]
            frames = re.findall(r'File "([^"]*)"', error["traceback"])
            assert all(f.startswith("<cell-") for f in frames), error["traceback"]
            shown = json.dumps({**r.json(), "error": {**error, "traceback": ""}})
        for leak in LEAKS:
            assert leak not in shown, (leak, shown)
        if r.status_code == 201:
            if path == "/kernels":
                server.client.delete(f"/kernels/{r.json()['kernel_id']}")
            else:
                server.client.delete(f"/sessions/{r.json()['session_id']}")
        if path.endswith("/messages") and r.status_code == 202:
            server.client.get(f"/sessions/{sid}/result", params={"timeout": "10"})

    check()


def test_a_server_error_shows_no_traceback_or_host_path() -> None:
    exc = KernelStartError(
        "the kernel did not start: MemoryError\nTraceback (most recent call last):\n"
        '  File "/work/main/sunroom/sandbox/kernel.py", line 12, in main\nMemoryError'
    )
    assert public_message(exc) == "the kernel did not start: MemoryError"
    exc = KernelStartError("bwrap failed on /home/alice/.cache/sunroom/k1/work: setrlimit")
    message = public_message(exc)
    assert "/home" not in message and "alice" not in message, message
    assert message == "bwrap failed on <path>: setrlimit"
    assert "the server failed" in public_message(
        KernelStartError("Traceback (most recent call last)")
    )


def test_every_range_is_documented() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "service.md").read_text()
    limits = docs.split("## Limits", 1)[1].split("\n## ", 1)[0]
    for name, (_low, high, _unit) in RANGES.items():
        row = next((line for line in limits.splitlines() if f"`{name}`" in line), None)
        if row is None:  # the cell timeout shares the row of limits.timeout_s
            row = next(line for line in limits.splitlines() if f"`{name.split('.')[-1]}`" in line)
        assert f"{high:,}" in row, (name, row)


def test_numbers_must_be_json_numbers_in_every_body(make_server: Callable[..., Server]) -> None:
    """Issue 26, item 7: fork's ``n`` and execute's ``timeout_s`` took strings; now none does."""
    server = make_server()
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    cases: list[tuple[str, dict[str, Any], str]] = [
        (f"/kernels/{kid}/fork", {"n": "2"}, "n"),
        (f"/kernels/{kid}/fork", {"n": 2.0}, "n"),
        (f"/kernels/{kid}/fork", {"n": True}, "n"),
        (f"/kernels/{kid}/execute", {"code": "1", "timeout_s": "1"}, "timeout_s"),
        (f"/kernels/{kid}/execute", {"code": "1", "timeout_s": True}, "timeout_s"),
        ("/kernels", {"limits": {"memory_mb": "512"}}, "limits.memory_mb"),
        ("/kernels", {"limits": {"timeout_s": "5"}}, "limits.timeout_s"),
        ("/sessions", {"max_turns": "3"}, "max_turns"),
        ("/sessions", {"budget": {"max_wall_s": "3"}}, "budget.max_wall_s"),
        ("/sessions", {"approval_timeout_s": "3"}, "approval_timeout_s"),
    ]
    for path, body, field in cases:
        assert_error(server.client.post(path, json=body), 422, field)
    assert server.client.get("/healthz").json()["kernels"] == 1  # nothing was forked or made
    r = server.client.post(f"/kernels/{kid}/execute", json={"code": "1 + 1", "timeout_s": 5})
    assert r.status_code == 200 and r.json()["value"] == "2"  # an int where a float goes: fine
