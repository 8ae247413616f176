"""A session request cannot send the server's model calls (and API keys) to an endpoint of its own."""

from __future__ import annotations

from collections.abc import Callable

from sunroom.providers import AssistantMessage, Model, TextPart
from sunroom.providers.fakes import ScriptedModel

from .conftest import Server


def _recording(seen: list[str | None]) -> Callable[[str, str | None], Model]:
    def resolve(spec: str, base_url: str | None) -> Model:
        seen.append(base_url)
        return ScriptedModel([AssistantMessage([TextPart("done")])] * 3)

    return resolve


def test_a_foreign_base_url_is_refused_and_nothing_is_recorded(
    make_server: Callable[..., Server],
) -> None:
    seen: list[str | None] = []
    server = make_server(resolve=_recording(seen))
    r = server.client.post(
        "/sessions", json={"task": "hi", "base_url": "http://127.0.0.1:9/steal-the-key"}
    )
    assert 400 <= r.status_code < 500, r.text
    assert "base_url" in r.text and "steal-the-key" not in r.text
    assert seen == []  # no model was ever built with that URL
    assert server.client.get("/sessions").json()["sessions"] == []


def test_listed_base_urls_are_accepted(make_server: Callable[..., Server]) -> None:
    seen: list[str | None] = []
    server = make_server(
        resolve=_recording(seen),
        base_url="http://127.0.0.1:8080/v1",
        allowed_base_urls=("http://127.0.0.1:8081/v1",),
    )
    for url in ("http://127.0.0.1:8081/v1/", "http://127.0.0.1:8080/v1", None):
        body = {"task": "hi"} | ({"base_url": url} if url else {})
        r = server.client.post("/sessions", json=body)
        assert r.status_code in (200, 201, 202), r.text
    assert seen == [
        "http://127.0.0.1:8081/v1/",
        "http://127.0.0.1:8080/v1",
        "http://127.0.0.1:8080/v1",
    ]


def test_a_client_cannot_bind_host_files(make_server: Callable[..., Server]) -> None:
    """File inputs name paths on the server's host: only its own user (sunroom run) binds them."""
    seen: list[str | None] = []
    server = make_server(resolve=_recording(seen))
    r = server.client.post(
        "/sessions", json={"task": "hi", "files": {"doc": {"path": "/etc/passwd"}}}
    )
    assert r.status_code == 422 and "binds no host files" in r.text, r.text
    assert seen == [] and server.client.get("/sessions").json()["sessions"] == []
