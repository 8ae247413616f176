"""Network policies over HTTP: named policies, a request's own allowlist, what is reported."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sunroom.providers import ScriptedModel
from sunroom.service import ServiceConfig
from tests.network.origin import serving
from tests.service.conftest import Server, code
from tests.service.test_routes import sse

pytestmark = pytest.mark.usefixtures("no_process_left")

CANARY = "SVCCANARY" + "0a1b2c3d4e5f60718293a4b5c6d7e8f9"


@pytest.fixture
def port() -> Iterator[int]:
    keyed = b"hello, keyed"
    with serving(lambda _, h: keyed if h.get("X-Key") == CANARY else b"hello") as port:
        yield port


def named(port: int) -> dict[str, object]:
    return {
        "allow": [f"api.test:{port}"],
        "hosts": {"api.test": "127.0.0.1"},
        "allow_addresses": ["127.0.0.1"],
        "inject": {f"api.test:{port}": {"X-Key": CANARY}},
    }


FETCH = (
    "import urllib.request\nurllib.request.urlopen('http://api.test:{port}/', timeout=20).read()"
)


def test_a_raw_kernel_names_a_configured_policy(
    make_server: Callable[..., Server], port: int
) -> None:
    server = make_server(backend="bwrap", networks={"api": named(port)})
    assert CANARY not in repr(server.config)
    kid = server.client.post("/kernels", json={"network": "api"}).json()["kernel_id"]
    r = server.client.post(f"/kernels/{kid}/execute", json={"code": FETCH.format(port=port)})
    assert r.json()["value"] == repr(b"hello, keyed"), r.text
    about = server.client.get(f"/kernels/{kid}").json()
    assert about["network"] == "api" and about["network_bytes"] > 0
    r = server.client.post("/kernels", json={"network": "nope"})
    assert r.status_code == 422 and "this server has: api" in r.json()["error"]["message"]


def test_a_request_s_own_allowlist_needs_client_network(
    make_server: Callable[..., Server], port: int
) -> None:
    closed = make_server(backend="bwrap", networks={"api": named(port)})
    r = closed.client.post("/kernels", json={"network": {"allow": ["pypi.org"]}})
    assert r.status_code == 422
    assert "--client-network" in r.json()["error"]["message"]
    opened = make_server(backend="bwrap", client_network=True)
    for bad in ({"allow": ["x"], "hosts": {"x": "10.0.0.1"}}, {"allow": ["x"], "inject": {}}):
        r = opened.client.post("/kernels", json={"network": bad})
        assert r.status_code == 422, r.text  # hosts only: no resolution, no credentials
    kid = opened.client.post(
        "/kernels", json={"network": {"allow": [f"api.test:{port}"], "max_bytes": 10_000}}
    ).json()["kernel_id"]
    r = opened.client.post(f"/kernels/{kid}/execute", json={"code": FETCH.format(port=port)})
    assert "HTTPError" in r.json()["error"]["type"]  # api.test resolves nowhere here: refused
    r = opened.client.post("/kernels", json={"backend": "subprocess", "network": {"allow": ["x"]}})
    assert r.status_code == 422 and "cannot enforce a network policy" in r.text


def test_a_session_streams_its_connections(make_server: Callable[..., Server], port: int) -> None:
    model = ScriptedModel([code(FETCH.format(port=port)), "done"])
    server = make_server(model, backend="bwrap", networks={"api": named(port)})
    sid = server.client.post("/sessions", json={"task": "go", "network": "api"}).json()[
        "session_id"
    ]
    r = server.client.get(f"/sessions/{sid}/result", params={"timeout": 60})
    assert r.json()["result"]["status"] == "success", r.text
    events = list(sse(server, sid))
    (done,) = [e["data"] for e in events if e["event"] == "ExecutionFinished"]
    assert "hello, keyed" in done["output"]
    (conn,) = [e["data"] for e in events if e["event"] == "NetworkConnection"]
    assert conn["host"] == "api.test" and conn["allowed"] is True and conn["bytes_received"] > 0
    assert CANARY not in str(events)
    stored = server.client.get(f"/sessions/{sid}").json()
    assert CANARY not in str(stored)


def test_the_config_checks_its_policies() -> None:
    with pytest.raises(ValueError, match="network 'bad'"):
        ServiceConfig(networks={"bad": {"allow": ["*.*"]}})
    with pytest.raises(ValueError, match="must be a Python identifier"):
        ServiceConfig(networks={"no-dash": {"allow": ["pypi.org"]}})
