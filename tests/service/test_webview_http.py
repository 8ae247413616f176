"""The web view over HTTP (no browser): login and cookie, CSRF, the reads the page makes, frames.

The browser suite (tests/ui) drives the page itself; this one pins the server's side of every
rule at the HTTP level, where each refusal is one request.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from sunroom.providers import (
    Price,
    ScriptedModel,
)
from sunroom.service.login import COOKIE, CookieSigner, LoginThrottle, same_origin
from tests.service.conftest import TOKEN, Server, agent_model, code
from tests.service.test_routes import sse

CSRF = {"X-Sunroom-CSRF": "1"}


@contextlib.contextmanager
def _login(server: Server) -> Iterator[httpx.Client]:
    """A client holding the web view's cookie (and no token), like the page."""
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        answer = browser.post("/ui/login", json={"token": TOKEN}, headers=CSRF)
        assert answer.status_code == 200, answer.text
        yield browser


def _status(server: Server, path: str, cookie: str) -> int:
    """The status of GET *path* with only the session cookie *cookie*."""
    with httpx.Client(base_url=server.url, timeout=30, cookies={COOKIE: cookie}) as client:
        return client.get(path).status_code


def test_the_login_sets_a_strict_http_only_cookie_that_is_not_the_token(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    answer = server.anon.post("/ui/login", json={"token": TOKEN})
    assert answer.status_code == 200 and answer.json() == {"logged_in": True}
    header = answer.headers["set-cookie"]
    flags = {part.strip().split("=")[0].lower() for part in header.split(";")}
    assert {"httponly", "path", "max-age", "samesite"} <= flags
    assert "samesite=strict" in header.lower() and "secure" not in flags  # plain http
    value = answer.cookies[COOKIE]
    assert TOKEN not in value and TOKEN not in header
    assert answer.headers["cache-control"] == "no-store"

    for wrong in ({"token": "nope"}, {"token": TOKEN + "x"}, {"tok": TOKEN}, [TOKEN]):
        refused = server.anon.post("/ui/login", json=wrong)
        assert refused.status_code == 401 and "set-cookie" not in refused.headers
        assert TOKEN not in refused.text


def test_the_cookie_opens_the_api_and_nothing_opens_it_without_one(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(ScriptedModel([code("print(1)"), "done"]))
    assert server.anon.get("/ui/me").status_code == 401
    assert server.anon.get("/ui/api/sessions").status_code == 401
    assert server.anon.get("/sessions").status_code == 401
    tampered = CookieSigner(TOKEN + "other", lifetime_s=60).issue()
    assert _status(server, "/sessions", tampered) == 401
    with _login(server) as browser:
        assert browser.get("/ui/me").json() == {"logged_in": True}
        assert browser.get("/sessions").status_code == 200
        created = browser.post("/sessions", json={"task": "go"}, headers=CSRF)
        assert created.status_code == 201
        sid = created.json()["session_id"]
        assert [e["event"] for e in sse(server, sid)][-1] == "end"
        assert browser.get(f"/sessions/{sid}").json()["status"] in ("idle", "finished")
        out = browser.post("/ui/logout", headers=CSRF)
        assert out.status_code == 200 and browser.cookies.get(COOKIE) is None
        assert browser.get("/ui/me").status_code == 401


def test_a_cookie_request_that_changes_something_needs_the_csrf_header_and_our_origin(
    make_server: Callable[..., Server],
) -> None:
    server = make_server()
    with _login(server) as browser:
        no_header = browser.post("/kernels", json={})
        assert no_header.status_code == 403
        assert no_header.json()["error"]["type"] == "CsrfRefused"
        wrong_value = browser.post("/kernels", json={}, headers={"X-Sunroom-CSRF": "yes"})
        assert wrong_value.status_code == 403
        for origin in ("http://evil.example", "null", f"http://127.0.0.1:{server.port + 1}"):
            foreign = browser.post("/kernels", json={}, headers={**CSRF, "Origin": origin})
            assert foreign.status_code == 403, origin
        ours = browser.post("/kernels", json={}, headers={**CSRF, "Origin": server.url})
        assert ours.status_code == 201
        kid = ours.json()["kernel_id"]
        assert browser.delete(f"/kernels/{kid}").status_code == 403  # DELETE too
        assert browser.delete(f"/kernels/{kid}", headers=CSRF).status_code == 200
    # the bearer token needs neither (programs, not browsers)
    assert server.client.post("/kernels", json={}).status_code == 201
    # a login from another origin is refused before the token is looked at
    foreign_login = server.anon.post(
        "/ui/login", json={"token": TOKEN}, headers={"Origin": "http://evil.example"}
    )
    assert foreign_login.status_code == 403 and "set-cookie" not in foreign_login.headers


def test_wrong_tokens_are_throttled_per_client(make_server: Callable[..., Server]) -> None:
    server = make_server()
    codes = [server.anon.post("/ui/login", json={"token": "x"}).status_code for _ in range(10)]
    assert codes == [401] * 10
    throttled = server.anon.post("/ui/login", json={"token": TOKEN})  # even the right one
    assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
    throttle = LoginThrottle(max_failures=2, window_s=10)
    throttle.failed("a", now=0)
    throttle.failed("a", now=1)
    assert throttle.retry_after("a", now=2) == pytest.approx(8)
    assert throttle.retry_after("b", now=2) is None
    assert throttle.retry_after("a", now=10.5) is None  # the first failure left the window


def test_cookies_expire_and_are_bound_to_the_token() -> None:
    signer = CookieSigner(TOKEN, lifetime_s=60)
    value = signer.issue(now=1000)
    assert signer.valid(value, now=1059) and not signer.valid(value, now=1061)
    assert not CookieSigner(TOKEN + "2", lifetime_s=60).valid(value, now=1000)
    version, expiry, nonce, mac = value.split(".")
    assert not signer.valid(f"{version}.{int(expiry) + 999}.{nonce}.{mac}", now=1000)
    assert not signer.valid("", now=0) and not signer.valid("v1...", now=0)
    assert same_origin("http://127.0.0.1:80", "127.0.0.1", "http")
    assert not same_origin("https://127.0.0.1:8765", "127.0.0.1:8765", "http")


def test_the_page_is_served_open_with_a_strict_policy(make_server: Callable[..., Server]) -> None:
    server = make_server()
    page = server.anon.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and page.headers["x-frame-options"] == "DENY"
    assert TOKEN not in page.text
    script = server.anon.get("/ui/static/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith(
        "text/javascript"
    )
    for bad in ("/ui/static/nope.js", "/ui/static/", "/ui/static/%2e%2e/app.py"):
        assert server.anon.get(bad).status_code == 404, bad
    # a client resolves "..": it asks for /ui/app.py, which is no open path
    assert server.anon.get("/ui/static/../app.py").status_code == 401


def test_without_the_ui_there_is_no_page_and_no_cookie(make_server: Callable[..., Server]) -> None:
    server = make_server(ui=False)
    assert server.anon.get("/").status_code in (401, 404)
    assert server.anon.post("/ui/login", json={"token": TOKEN}).status_code in (401, 404)
    assert _status(server, "/sessions", CookieSigner(TOKEN, lifetime_s=60).issue()) == 401


def test_the_log_is_what_sse_sends_and_the_list_sums_each_session(
    make_server: Callable[..., Server],
) -> None:
    cell = "print(predict_many('up', ['a', 'b', 'c']))"
    server = make_server(agent_model([cell], Price(input=1, output=1)))
    sid = server.client.post("/sessions", json={"task": "go"}).json()["session_id"]
    streamed = [e["data"] for e in sse(server, sid) if e["event"] != "end"]
    with _login(server) as browser:
        log = browser.get(f"/ui/api/sessions/{sid}/log").json()
        assert log["events"] == streamed and log["more"] is False
        assert log["last_seq"] >= streamed[-1]["seq"]
        page = browser.get(f"/ui/api/sessions/{sid}/log", params={"after": 2, "limit": 3}).json()
        assert page["last_seq"] == 5 and page["more"] is True  # Transcript events are skipped
        assert [e["seq"] for e in page["events"]] == [
            e["seq"] for e in streamed if 2 < e["seq"] <= 5
        ]
        assert browser.get(f"/ui/api/sessions/{sid}/log?limit=0").status_code == 422
        assert browser.get("/ui/api/sessions/nope/log").status_code == 404
        rows = browser.get("/ui/api/sessions").json()["sessions"]
    row = next(r for r in rows if r["session_id"] == sid)
    ended = next(e for e in streamed if e["type"] == "SessionEnded")["result"]
    assert row["preset"] == "codeact" and row["model"] == "fake:test" and row["task"] == "go"
    assert row["turns"] == ended["turns"] == 2
    assert row["model_calls"] == ended["model_calls"] == 5 and row["sub_calls"] == 3
    assert row["input_tokens"] == ended["usage"]["input_tokens"] > 0
    assert row["cost_micro_usd"] == ended["cost_micro_usd"]


def test_an_html_output_is_served_alone_in_a_sandbox(make_server: Callable[..., Server]) -> None:
    cell = (
        "display({'text/html': '<b id=x>hi</b><script>1</script>'}, raw=True)\n"
        "display({'image/png': 'AAAA'}, raw=True)"
    )
    server = make_server(ScriptedModel([code(cell), "done"]))
    sid = server.client.post("/sessions", json={"task": "go"}).json()["session_id"]
    finished = next(e for e in sse(server, sid) if e["event"] == "ExecutionFinished")
    seq = finished["data"]["seq"]
    assert len(finished["data"]["outputs"]) == 2
    assert server.anon.get(f"/ui/frame/{sid}/{seq}/0").status_code == 401
    with _login(server) as browser:
        frame = browser.get(f"/ui/frame/{sid}/{seq}/0")
        assert frame.status_code == 200 and frame.text == "<b id=x>hi</b><script>1</script>"
        policy = frame.headers["content-security-policy"]
        assert policy.startswith("sandbox allow-scripts;") and "allow-same-origin" not in policy
        assert "connect-src" not in policy and "default-src 'none'" in policy
        for bad in (f"{seq}/1", f"{seq}/2", f"{seq - 1}/0", "999999/0"):
            assert browser.get(f"/ui/frame/{sid}/{bad}").status_code == 404, bad


def test_sub_calls_reach_the_log_as_nodes(make_server: Callable[..., Server]) -> None:
    server = make_server(agent_model(["print(predict_many('x', ['a', 'b']))"]))
    sid = server.client.post("/sessions", json={"task": "go"}).json()["session_id"]
    data = [e["data"] for e in sse(server, sid)]
    nodes = sorted((d for d in data if d.get("type") == "SubCallEnded"), key=lambda d: d["index"])
    assert [(n["index"], n["parent"], n["depth"], n["output"]) for n in nodes] == [
        (0, None, 1, '"leaf:a"'),
        (1, None, 1, '"leaf:b"'),
    ]
    started = next(d for d in data if d.get("type") == "HostCallStarted")
    assert started["arguments"].startswith('{"instructions": "x", "inputs": ["a", "b"]')
    assert {n["call_id"] for n in nodes} == {started["call_id"]}


def test_the_ui_setting_comes_from_the_environment_and_the_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sunroom.service import ServiceConfig

    assert ServiceConfig.from_env().ui is True
    monkeypatch.setenv("SUNROOM_UI", "0")
    assert ServiceConfig.from_env().ui is False
    monkeypatch.setenv("SUNROOM_UI", "1")
    assert ServiceConfig.from_env(ui=False).ui is False  # the flag wins


def test_a_following_stream_stays_open_across_runs_and_pins_nothing(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(agent_model(["print('one')", "print('two')"]), session_idle_s=1.0)
    sid = server.client.post("/sessions", json={"task": "go"}).json()["session_id"]
    kinds: list[str] = []
    seqs: list[int] = []
    released_while_followed = False
    with server.client.stream("GET", f"/sessions/{sid}/events?follow=1") as answer:
        assert answer.status_code == 200
        name = ""
        for line in answer.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("id: "):
                seqs.append(int(line.removeprefix("id: ")))
            elif line.startswith("data: ") and name:
                kinds.append(name)
                if name == "idle" and kinds.count("idle") == 1:
                    deadline = time.monotonic() + 20
                    while server.client.get("/healthz").json()["sessions_released"] == 0:
                        assert time.monotonic() < deadline, "a following reader pinned the session"
                        time.sleep(0.1)
                    released_while_followed = True
                    sent = server.client.post(f"/sessions/{sid}/messages", json={"text": "again"})
                    assert sent.status_code == 202
                elif name == "idle":
                    break
    assert released_while_followed and "end" not in kinds
    first = kinds.index("idle")
    assert "SessionEnded" in kinds[:first] and "SessionEnded" in kinds[first + 1 :]
    assert "KernelRestarted" in kinds[first + 1 :]  # the released session came back
    assert seqs == sorted(set(seqs))  # no repeat across the runs
    assert server.client.get(f"/sessions/{sid}/events?follow=2").status_code == 422
