"""``GET /metrics`` of a real server on loopback: Prometheus' text format, real values after real work."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sunroom.providers import AssistantMessage, Model, TextPart, ToolCall
from sunroom.providers.fakes import ScriptedModel
from sunroom.providers.pricing import Price
from sunroom.service import ServiceConfig

from .conftest import TOKEN, Server, code

Labels = dict[str, str]


def scrape(client: httpx.Client) -> dict[str, list[tuple[Labels, float]]]:
    """Every sample of ``/metrics``: name → [(labels, value)]."""
    answer = client.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    out: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def value(samples: dict[str, list[tuple[Labels, float]]], name: str, **labels: str) -> float:
    """The value of the sample *name* whose labels include *labels* (0 when there is none)."""
    found = [v for have, v in samples.get(name, []) if labels.items() <= have.items()]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else 0.0


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_metrics_need_the_token(make_server: Callable[..., Server]) -> None:
    server = make_server()
    refused = server.anon.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "Unauthorized"
    assert server.client.get("/kernels/0123abcd").status_code == 404
    assert server.client.get("/no/such/route").status_code == 404
    samples = scrape(server.client)
    # counted by route template (never the path with its ids); the refused scrape too
    assert value(samples, "sunroom_http_requests_total", route="/metrics", status="401") == 1
    assert value(samples, "sunroom_http_requests_total", route="/kernels/{kid}", status="404") == 1
    assert value(samples, "sunroom_http_requests_total", route="unmatched", status="404") == 1
    assert not any("0123abcd" in json.dumps(labels) for s in samples.values() for labels, _ in s)
    assert value(samples, "sunroom_sessions", status="running") == 0
    assert value(samples, "sunroom_sessions_live") == 0


def test_metrics_public_needs_no_token(make_server: Callable[..., Server]) -> None:
    server = make_server(metrics_public=True)
    samples = scrape(server.anon)
    assert value(samples, "sunroom_sessions_live") == 0
    assert value(samples, "sunroom_http_requests_total", route="/metrics", status="200") == 0
    assert server.anon.get("/kernels").status_code == 401  # only /metrics is open
    samples = scrape(server.anon)
    assert value(samples, "sunroom_http_requests_total", route="/metrics", status="200") == 1
    assert value(samples, "sunroom_http_requests_total", route="/kernels", status="401") == 1


def test_metrics_public_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUNROOM_METRICS_PUBLIC", "1")
    assert ServiceConfig.from_env().metrics_public is True
    monkeypatch.setenv("SUNROOM_METRICS_PUBLIC", "0")
    assert ServiceConfig.from_env().metrics_public is False
    monkeypatch.delenv("SUNROOM_METRICS_PUBLIC")
    assert ServiceConfig.from_env().metrics_public is False


def test_each_server_has_its_own_registry(make_server: Callable[..., Server]) -> None:
    one, other = make_server(), make_server()
    assert one.anon.get("/metrics").status_code == 401
    assert value(scrape(one.client), "sunroom_http_requests_total", status="401") == 1
    assert value(scrape(other.client), "sunroom_http_requests_total", status="401") == 0


@pytest.mark.kernel
def test_a_raw_kernel_execute_moves_the_execute_histogram(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    before = scrape(server.client)
    assert value(before, "sunroom_execute_seconds_count", backend="subprocess") == 0
    kid = server.client.post("/kernels", json={}).json()["kernel_id"]
    samples = scrape(server.client)
    assert value(samples, "sunroom_kernels", backend="subprocess") == 1
    code_ = "import time\ntime.sleep(0.2)"
    out = server.client.post(f"/kernels/{kid}/execute", json={"code": code_}).json()
    assert out["ok"] is True
    samples = scrape(server.client)
    assert value(samples, "sunroom_execute_seconds_count", backend="subprocess") == 1
    seconds = value(samples, "sunroom_execute_seconds_sum", backend="subprocess")
    assert seconds == pytest.approx(out["duration_s"]) and seconds >= 0.2
    assert value(samples, "sunroom_execute_seconds_bucket", backend="subprocess", le="0.1") == 0
    assert value(samples, "sunroom_execute_seconds_bucket", backend="subprocess", le="+Inf") == 1
    route = "/kernels/{kid}/execute"
    assert value(samples, "sunroom_http_requests_total", route=route, status="200") == 1
    assert not any(kid in json.dumps(labels) for s in samples.values() for labels, _ in s)
    server.client.delete(f"/kernels/{kid}")
    assert value(scrape(server.client), "sunroom_kernels", backend="subprocess") == 0


@pytest.mark.kernel
def test_a_session_moves_model_calls_tokens_cost_cells_and_host_calls(
    make_server: Callable[..., Server],
) -> None:
    def double(x: int) -> int:
        """Twice x."""
        return 2 * x

    price = Price(input=3, output=5)  # micro-USD per token
    model = ScriptedModel([code("print(double(21))"), "forty-two"], price=price)
    server = make_server(model, functions=[double], default_model="fake:test-model")
    sid = server.client.post("/sessions", json={"task": "double it"}).json()["session_id"]
    result = server.client.get(f"/sessions/{sid}/result", params={"timeout": 30}).json()
    assert result["status"] == "finished", result
    usage = _last_usage(server, sid)
    assert usage["model_calls"] == 2 and usage["cost_micro_usd"] > 0

    samples = scrape(server.client)
    who = {"provider": "fake", "model": "test-model"}
    assert value(samples, "sunroom_model_calls_total", **who) == 2
    tokens = usage["usage"]
    assert tokens["input_tokens"] > 0 and tokens["output_tokens"] > 0
    assert (
        value(samples, "sunroom_model_tokens_total", **who, direction="input")
        == tokens["input_tokens"]
    )
    assert (
        value(samples, "sunroom_model_tokens_total", **who, direction="output")
        == tokens["output_tokens"]
    )
    assert value(samples, "sunroom_model_cost_micro_usd_total", **who) == usage["cost_micro_usd"]
    assert usage["cost_micro_usd"] == 3 * tokens["input_tokens"] + 5 * tokens["output_tokens"]
    assert value(samples, "sunroom_host_call_seconds_count", function="double") == 1
    assert value(samples, "sunroom_execute_seconds_count", backend="subprocess") == 1
    assert value(samples, "sunroom_sessions", status="finished") == 1
    assert value(samples, "sunroom_sessions_live") == 1  # idle, still holding its kernel
    assert value(samples, "sunroom_kernels", backend="subprocess") == 1


def _last_usage(server: Server, sid: str) -> dict[str, Any]:
    """The payload of the session's last ``UsageUpdated`` event, read from its SSE log."""
    last: dict[str, Any] = {}
    with server.client.stream("GET", f"/sessions/{sid}/events") as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if data.get("type") == "UsageUpdated":
                    last = data
    assert last, "the session published no UsageUpdated"
    return last


@pytest.mark.kernel
def test_every_429_is_counted(make_server: Callable[..., Server]) -> None:
    server = make_server(
        lambda: ScriptedModel([code("import time\ntime.sleep(30)")]), max_sessions=1, max_kernels=1
    )
    assert server.client.post("/kernels", json={}).status_code == 201
    assert server.client.post("/kernels", json={}).status_code == 429
    assert server.client.post("/sessions", json={"task": "a"}).status_code == 201
    assert server.client.post("/sessions", json={"task": "b"}).status_code == 429
    assert server.client.post("/sessions", json={"task": "c"}).status_code == 429
    samples = scrape(server.client)
    assert value(samples, "sunroom_http_429_total", route="/kernels") == 1
    assert value(samples, "sunroom_http_429_total", route="/sessions") == 2
    counted = value(samples, "sunroom_http_requests_total", route="/sessions", status="429")
    assert counted == 2


@pytest.mark.kernel
def test_template_pool_hits_and_misses_are_counted(make_server: Callable[..., Server]) -> None:
    server = make_server(ScriptedModel([]), templates={"warm": "import json\nwarm = 21"})
    for _ in range(3):
        r = server.client.post("/kernels", json={"template": "warm"})
        assert r.status_code == 201, r.text
    samples = scrape(server.client)
    pool = {"pool": "template:warm"}
    assert value(samples, "sunroom_warm_pool_misses_total", **pool) == 1  # started by the first
    assert value(samples, "sunroom_warm_pool_hits_total", **pool) == 2
    assert value(samples, "sunroom_kernel_claim_seconds_count", **pool) == 3
    assert value(samples, "sunroom_kernels", backend="subprocess") == 3
    # a session of the template claims from the same pool, and its kernel counts too
    sid = server.client.post("/sessions", json={"template": "warm"}).json()["session_id"]
    wait_for(lambda: server.client.get(f"/sessions/{sid}/files").status_code == 200)
    samples = scrape(server.client)
    assert value(samples, "sunroom_warm_pool_hits_total", **pool) == 3
    assert value(samples, "sunroom_kernels", backend="subprocess") == 4
    assert value(samples, "sunroom_sessions_live") == 1


def _slow_model() -> Model:
    cell = AssistantMessage(
        [ToolCall("c1", "execute_code", {"code": "import time; time.sleep(60)"})]
    )
    return ScriptedModel([cell, AssistantMessage([TextPart("done")])])


@pytest.mark.kernel
def test_a_session_taken_over_from_a_stopped_server_is_a_lease_handover(
    make_server: Callable[..., Server],
) -> None:
    first = make_server(_slow_model)
    sid = first.client.post("/sessions", json={"task": "work"}).json()["session_id"]
    wait_for(lambda: first.client.get(f"/sessions/{sid}").json()["owner"] is not None)
    second = make_server(_slow_model)  # the same store, another owner
    assert value(scrape(second.client), "sunroom_lease_handovers_total") == 0
    who = {"provider": "fake", "model": "test"}
    wait_for(lambda: value(scrape(first.client), "sunroom_model_calls_total", **who) == 1)
    first.stop()  # its session stays running, for another server to take over
    wait_for(lambda: value(scrape(second.client), "sunroom_lease_handovers_total") == 1)
    assert value(scrape(second.client), "sunroom_sessions_live") == 1
    # the resumed run calls the model again: the second server counts that call alone, not
    # the totals the session's log carried over from the first
    wait_for(lambda: value(scrape(second.client), "sunroom_model_calls_total", **who) > 0)
    assert value(scrape(second.client), "sunroom_model_calls_total", **who) == 1


@pytest.mark.kernel
def test_e2b_warm_pool_claims_are_counted(make_server: Callable[..., Server]) -> None:
    server = make_server(e2b_pool=1)
    api = httpx.Client(base_url=server.url, headers={"X-API-KEY": TOKEN}, timeout=60)
    pool = {"pool": "e2b"}
    made = 0
    with api:
        while value(scrape(server.client), "sunroom_warm_pool_hits_total", **pool) == 0:
            assert made < 20, "no claim found a warm kernel ready"
            time.sleep(0.5)  # the pool fills in the background
            created = api.post("/v2/sandboxes", json={"templateID": "base"})
            assert created.status_code == 201, created.text
            made += 1
            assert api.delete(f"/sandboxes/{created.json()['sandboxID']}").status_code == 204
    samples = scrape(server.client)
    hits = value(samples, "sunroom_warm_pool_hits_total", **pool)
    misses = value(samples, "sunroom_warm_pool_misses_total", **pool)
    assert hits >= 1 and hits + misses == made
    assert value(samples, "sunroom_kernel_claim_seconds_count", **pool) == made
    route = {"route": "/v2/sandboxes", "method": "POST"}  # the facade's own route template
    assert value(samples, "sunroom_http_requests_total", **route, status="201") == made
