"""Error responses: one clear sentence, no internals, no echoed input; 5xx logged with a traceback."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from sunroom.providers import Model
from sunroom.service import resolve_model
from tests.service.conftest import Server

INTERNALS = ("Traceback", "CreateSession", "ServiceConfig", "pydantic", "input_value", "[type=")


def assert_clean(message: str, *secrets: str) -> None:
    for word in (*INTERNALS, *secrets):
        assert word not in message, (word, message)


def test_an_internal_failure_is_a_plain_500_logged_with_its_traceback(
    make_server: Callable[..., Server], caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Model:
        raise RuntimeError("internal detail sk-live-0123456789")

    server = make_server(broken)
    with caplog.at_level(logging.ERROR, logger="sunroom.service"):
        r = server.client.post("/sessions", json={"task": "t"})
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert error["type"] == "InternalError"
    assert_clean(error["message"], "internal detail", "sk-live", "RuntimeError")
    logged = [rec for rec in caplog.records if rec.exc_info is not None]
    assert logged, "the 500 was not logged with its traceback"
    assert "internal detail" in caplog.text and "Traceback" in caplog.text
    assert server.client.get("/sessions").json()["sessions"] == []  # nothing was recorded


def test_validation_errors_name_the_field_never_the_input_or_a_class(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    r = server.client.post("/sessions", json=[1, 2])
    assert r.status_code == 422 and r.json()["error"]["type"] == "ValidationError"
    assert_clean(r.json()["error"]["message"])
    r = server.client.post("/sessions", json={"max_turns": "sk-secret-turns", "preset": "sk-nope"})
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert "max_turns" in message and "preset" in message
    assert_clean(message, "sk-secret-turns", "sk-nope")
    r = server.client.get("/sessions", params={"limit": "lots"})
    assert r.status_code == 422 and "limit" in r.json()["error"]["message"]
    r = server.client.get("/sessions/x/result", params={"timeout": "soon"})
    assert r.status_code == 422


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("nope:x", ["unknown provider", "nope"]),
        ("no-colon", ["provider"]),
        ("openai:gpt-5-mini", ["OPENAI_API_KEY"]),
    ],
)
def test_a_model_that_cannot_be_built_records_no_session(
    make_server: Callable[..., Server],
    monkeypatch: pytest.MonkeyPatch,
    model: str,
    words: list[str],
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server = make_server(resolve=resolve_model)
    r = server.client.post("/sessions", json={"task": "t", "model": model})
    assert r.status_code in (422, 502), r.text
    message = r.json()["error"]["message"]
    assert all(w in message for w in words), message
    assert_clean(message)
    assert server.client.get("/sessions").json()["sessions"] == []
