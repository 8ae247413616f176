"""The web view in headless Chromium against a real server with scripted models.

Each test saves screenshots of the views it reached (tests/ui/conftest.py says where).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import http.server
import io
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image
from playwright.sync_api import Page, expect

from sunroom.agent import AsyncSession
from sunroom.providers import AssistantMessage, FunctionModel, Price, Request
from sunroom.service.codec import event_to_json
from sunroom.store import NewEvent, SQLiteStore
from tests.agent.test_branches import branch_model, drain
from tests.service.conftest import TOKEN, Server, agent_model, code, sub_input
from tests.service.test_routes import sse
from tests.ui.conftest import PageFor, wait_view

Shot = Callable[[Page, str], Path]


def _gate() -> tuple[threading.Event, Callable[[], bool]]:
    """An event and the host function ``wait_for_host`` that blocks a cell until it is set."""
    release = threading.Event()

    def wait_for_host() -> bool:
        """Returns when the test lets the cell go on."""
        return release.wait(120)

    return release, wait_for_host


def _create(server: Server, **body: object) -> str:
    answer = server.client.post("/sessions", json={"task": "go", **body})
    assert answer.status_code == 201, answer.text
    sid: str = answer.json()["session_id"]
    return sid


def _open_session(page: Page, sid: str) -> None:
    page.get_by_test_id("session-row").and_(page.locator(f"[data-session-id='{sid}']")).click()
    wait_view(page, "session")
    expect(page.locator("[data-ready='1']")).to_have_count(1)


def _log_seqs(server: Server, sid: str) -> list[int]:
    return [int(e["id"]) for e in sse(server, sid) if e["event"] != "end"]


def test_only_the_login_form_shows_until_the_token_is_given(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    server = make_server(agent_model(["print('hello')"]))
    sid = _create(server)
    list(sse(server, sid))
    page = page_for(server, login=False)
    expect(page.get_by_test_id("login-form")).to_be_visible()
    assert page.evaluate("document.body.dataset.view") == "login"
    expect(page.get_by_test_id("session-row")).to_have_count(0)
    shot(page, "login")
    page.get_by_test_id("login-token").fill("wrong-token")
    page.get_by_test_id("login-submit").click()
    expect(page.get_by_test_id("login-error")).to_be_visible()
    assert page.evaluate("document.body.dataset.view") == "login"
    page.get_by_test_id("login-token").fill(TOKEN)
    page.get_by_test_id("login-submit").click()
    wait_view(page, "list")
    row = page.locator(f"[data-testid='session-row'][data-session-id='{sid}']")
    expect(row).to_be_visible()
    expect(page.get_by_test_id("login-token")).to_have_count(0)  # the form is gone
    shot(page, "sessions")


def test_a_running_cell_streams_its_output_into_the_open_page(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    release, wait_for_host = _gate()
    cell = "print('first line', flush=True)\nprint('released:', wait_for_host())\nsubmit('ok')"
    server = make_server(agent_model([cell]), functions=[wait_for_host])
    page = page_for(server)
    sid = _create(server)
    _open_session(page, sid)
    output = page.get_by_test_id("cell-output").first
    expect(output).to_contain_text("first line")  # while the cell waits in wait_for_host
    assert not release.is_set()
    expect(page.get_by_test_id("final-answer")).to_have_count(0)
    shot(page, "running")
    release.set()
    expect(output).to_contain_text("released: True")
    expect(page.get_by_test_id("final-answer")).to_contain_text("ok")
    expect(page.get_by_test_id("host-call").first).to_contain_text("wait_for_host")
    shot(page, "finished")


def test_a_cell_with_an_image_output_shows_the_image(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (120, 60), (200, 40, 40)).save(buffer, format="PNG")
    png = base64.b64encode(buffer.getvalue()).decode()
    cell = f"display({{'image/png': {png!r}, 'text/plain': 'a red box'}}, raw=True)"
    server = make_server(agent_model([cell]))
    sid = _create(server)
    list(sse(server, sid))
    page = page_for(server)
    _open_session(page, sid)
    image = page.get_by_test_id("output-image").first
    expect(image).to_be_visible()
    size = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert size == [120, 60]
    shot(page, "image")


def test_predict_many_over_5_items_is_5_children_with_cost(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    cell = "print(predict_many('up', ['a', 'b', 'c', 'd', 'e']))"
    server = make_server(agent_model([cell], price=Price(input=3, output=15)))
    sid = _create(server)
    events = [e["data"] for e in sse(server, sid) if e["event"] != "end"]
    nodes = [e for e in events if e["type"] == "SubCallEnded"]
    assert len(nodes) == 5
    page = page_for(server)
    _open_session(page, sid)
    tree = page.get_by_test_id("tree")
    expect(tree).to_be_visible()
    parent = tree.locator("[data-testid='tree-node'][data-depth='1']").filter(
        has_text="predict_many"
    )
    expect(parent).to_have_count(1)
    parent.get_by_test_id("tree-toggle").click()
    children = tree.locator("[data-testid='tree-node'][data-depth='2']")
    expect(children).to_have_count(5)
    for node in nodes:
        row = tree.locator(f"[data-testid='tree-node'][data-node='{node['node']}']")
        expect(row).to_contain_text(f"{node['cost_micro_usd']:,}")  # micro-USD, as logged
    total = sum(n["cost_micro_usd"] for n in nodes)
    expect(parent).to_contain_text(f"{total:,}")  # rolled up to the parent
    shot(page, "tree")


def test_a_pending_approval_is_answered_from_the_page(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    done: list[str] = []

    def delete_repo(name: str) -> str:
        """Delete a repository (a stand-in with a side effect)."""
        done.append(name)
        return f"deleted {name}"

    cell = "print(delete_repo(name='demo'))\nsubmit('finished')"
    server = make_server(agent_model([cell]), functions=[delete_repo])
    page = page_for(server)
    sid = _create(server, approvals={"delete_*": "ask"}, approval_timeout_s=120)
    _open_session(page, sid)
    approval = page.get_by_test_id("approval")
    expect(approval).to_be_visible()
    expect(approval).to_contain_text("delete_repo")
    expect(approval).to_contain_text("demo")
    shot(page, "approval")
    assert done == []
    approval.get_by_test_id("approve-allow").click()
    expect(page.get_by_test_id("final-answer")).to_contain_text("finished")
    expect(page.get_by_test_id("approval")).to_have_count(0)
    assert done == ["demo"]


def test_a_reload_mid_run_continues_with_no_gap_and_no_duplicate(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    release, wait_for_host = _gate()
    cell = (
        "for i in range(5):\n    print('before', i, flush=True)\n"
        "wait_for_host()\n"
        "for i in range(5):\n    print('after', i, flush=True)\n"
        "submit('done')"
    )
    server = make_server(agent_model([cell]), functions=[wait_for_host])
    page = page_for(server)
    sid = _create(server)
    _open_session(page, sid)
    expect(page.get_by_test_id("cell-output").first).to_contain_text("before 4")
    page.reload()
    wait_view(page, "session")
    expect(page.locator("[data-ready='1']")).to_have_count(1)
    release.set()
    expect(page.get_by_test_id("final-answer")).to_contain_text("done")
    seqs = _log_seqs(server, sid)
    expect(page.get_by_test_id("event-count")).to_have_text(str(len(seqs)))
    text = page.get_by_test_id("cell-output").first.inner_text()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines == [f"before {i}" for i in range(5)] + [f"after {i}" for i in range(5)]
    shot(page, "reloaded")


def test_no_token_in_any_url_page_or_storage_and_the_cookie_is_locked(
    make_server: Callable[..., Server], page_for: PageFor
) -> None:
    server = make_server(agent_model(["print('x')"]))
    sid = _create(server)
    list(sse(server, sid))
    page = page_for(server, login=False)
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.get_by_test_id("login-token").fill(TOKEN)
    page.get_by_test_id("login-submit").click()
    wait_view(page, "list")
    _open_session(page, sid)
    assert urls and all(TOKEN not in u for u in urls)
    assert TOKEN not in page.url and TOKEN not in page.content()
    storage = page.evaluate(
        "JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage)])"
    )
    assert TOKEN not in storage
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
    assert page.evaluate("document.getElementById('login-token')") is None
    (cookie,) = page.context.cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/" and TOKEN not in cookie["value"]
    # without the cookie, the API answers 401 to the same page's own scripts
    page.context.clear_cookies()
    status = page.evaluate(
        "fetch('/ui/api/sessions', {headers: {'X-Sunroom-CSRF': '1'}}).then(r => r.status)"
    )
    assert status == 401


PROBE = """<p id="r">probing</p><script>
const out = {};
try { out.parent = String(window.parent.document.title); } catch (e) { out.parent = 'blocked'; }
try { out.cookie = String(document.cookie); } catch (e) { out.cookie = 'blocked'; }
try { out.storage = String(localStorage.length); } catch (e) { out.storage = 'blocked'; }
fetch('/ui/api/sessions', {credentials: 'include', headers: {'X-Sunroom-CSRF': '1'}})
  .then(r => r.text()).then(t => { out.api = 'read:' + t.slice(0, 40); })
  .catch(() => { out.api = 'blocked'; })
  .finally(() => { document.getElementById('r').textContent = JSON.stringify(out); });
</script>"""


def test_an_html_output_with_a_script_cannot_reach_the_page_cookie_or_api(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    cell = f"display({{'text/html': {PROBE!r}}}, raw=True)"
    server = make_server(agent_model([cell]))
    sid = _create(server)
    list(sse(server, sid))
    page = page_for(server)
    _open_session(page, sid)
    frame_element = page.get_by_test_id("output-html-frame").first
    expect(frame_element).to_be_visible()
    assert frame_element.get_attribute("sandbox") == "allow-scripts"
    frame = frame_element.content_frame
    assert frame is not None
    expect(frame.locator("#r")).not_to_have_text("probing", timeout=10_000)
    result = json.loads(frame.locator("#r").inner_text())
    assert result == {"parent": "blocked", "cookie": "blocked", "storage": "blocked",
                      "api": "blocked"}  # fmt: skip
    assert page.evaluate("document.querySelectorAll('#r').length") == 0  # not in the page
    shot(page, "html-frame")


def test_a_cross_site_form_post_is_refused(
    make_server: Callable[..., Server], page_for: PageFor
) -> None:
    """A page of another origin auto-submits a JSON-shaped text/plain form to POST /sessions.

    From ``localhost`` (another site) the browser does not send the SameSite=Strict cookie:
    401. From ``127.0.0.1`` on another port (the same site, another origin) it does, and the
    missing CSRF header and the foreign Origin refuse it: 403. Either way nothing is created.
    """
    server = make_server(agent_model(["print('x')"]))
    page = page_for(server)  # logged in: the browser holds the cookie
    before = len(server.client.get("/sessions").json()["sessions"])
    target = f"{server.url}/sessions"
    attack = (
        f'<form id="f" method="POST" action="{target}" enctype="text/plain">'
        '<input name=\'{"task":"pwned","system_prompt":"\' value=\'"}\'></form>'
        "<script>document.getElementById('f').submit()</script>"
    ).encode()

    class Evil(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(attack)))
            self.end_headers()
            self.wfile.write(attack)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

    evil = http.server.HTTPServer(("127.0.0.1", 0), Evil)
    thread = threading.Thread(target=evil.serve_forever, daemon=True)
    thread.start()
    try:
        for host, status in (("localhost", 401), ("127.0.0.1", 403)):
            with page.expect_response(target) as answer:
                page.goto(f"http://{host}:{evil.server_address[1]}/")
            assert answer.value.status == status, host
    finally:
        evil.shutdown()
        evil.server_close()
    time.sleep(0.2)
    assert len(server.client.get("/sessions").json()["sessions"]) == before


async def _branched_log(db: Path) -> str:
    """Run a real branched session (library) and store its events as the service would."""
    model = branch_model(
        [
            ["rows = [3, 4]\ntotal = sum(rows)\nsubmit(total)"],
            ["rows = [3, 4]\nsubmit(rows[0] + rows[1])"],
        ]
    )
    async with AsyncSession(model=model, backend="subprocess", output=int) as s:
        sub = s.events()
        result = await s.run("add them", branches=2, choose="vote")
        events = drain(sub)
    assert result.ok
    sid = s.session_id
    async with SQLiteStore(db) as store:
        config = {"task": "add them", "preset": "codeact", "model": "branches"}
        await store.create_session(sid, config=config, owner="test", lease_s=60)
        rows = []
        for i, event in enumerate(events, start=1):
            kind, payload = event_to_json(event, session_id=sid)
            rows.append(NewEvent(seq=i, kind=kind, payload=payload, ts=event.ts))
        await store.append(sid, rows, owner="test")
        ended = [p for k, p in (event_to_json(e, session_id=sid) for e in events)
                 if k == "SessionEnded"]  # fmt: skip
        await store.finish_session(sid, status="finished", result=ended[-1]["result"],  # type: ignore[arg-type]
                                   owner="test")  # fmt: skip
        await store.release(sid, owner="test")
    return sid


def test_branches_show_the_chosen_one_and_a_diff_of_their_final_cells(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot, tmp_path: Path
) -> None:
    db = tmp_path / "branches.db"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright's loop runs here
        sid = pool.submit(asyncio.run, _branched_log(db)).result(timeout=120)
    server = make_server(db_path=db)
    page = page_for(server)
    _open_session(page, sid)
    tabs = page.get_by_test_id("branch")
    expect(tabs).to_have_count(2)
    chosen = page.get_by_test_id("branch-chosen")
    expect(chosen).to_have_count(1)
    diff = page.get_by_test_id("branch-diff")
    expect(diff).to_contain_text("total = sum(rows)")
    expect(diff).to_contain_text("submit(rows[0] + rows[1])")
    expect(page.get_by_test_id("final-answer")).to_contain_text("7")
    shot(page, "branches")


def test_a_nested_run_is_a_tree_three_levels_deep_rolled_up(
    make_server: Callable[..., Server], page_for: PageFor, shot: Shot
) -> None:
    """root -> predict(recursive=True) x2 -> each nested session -> predict_many over 3."""

    def reply(request: Request) -> str | AssistantMessage:
        if not request.tools:  # a leaf
            return "leaf:" + sub_input(request)
        turns = sum(isinstance(m, AssistantMessage) for m in request.messages)
        nested = "deeper" in str(request.messages)  # a nested session's task is "deeper"
        if turns == 0 and nested:
            return code("submit(' '.join(predict_many('leaf', ['p', 'q', 'r'])))")
        if turns == 0:
            return code(
                "r = predict_many('deeper', ['x', 'y'], recursive=True)\nsubmit(' | '.join(r))"
            )
        return "done"

    model = FunctionModel(reply, name="tree", price=Price(input=1, output=1))
    server = make_server(model)
    refused = server.client.post("/sessions", json={"task": "go", "max_depth": 4})
    assert refused.status_code == 422
    sid = _create(server, max_depth=2, preset="rlm")
    events = [e["data"] for e in sse(server, sid) if e["event"] != "end"]
    nodes = [e for e in events if e["type"] == "SubCallEnded"]
    assert len(nodes) == 2 + 6, [n["error"] for n in nodes]
    top = [n for n in nodes if n["parent"] is None]
    page = page_for(server)
    _open_session(page, sid)
    tree = page.get_by_test_id("tree")
    tree.locator("[data-testid='tree-node'][data-depth='1']").get_by_test_id("tree-toggle").click()
    for node in top:
        row = tree.locator(f"[data-testid='tree-node'][data-node='{node['node']}']")
        row.get_by_test_id("tree-toggle").click()
        kids = [n for n in nodes if n["parent"] == node["node"]]
        rolled = node["cost_micro_usd"] + sum(k["cost_micro_usd"] for k in kids)
        expect(row.get_by_test_id("tree-rollup")).to_have_text(f"{rolled:,}")
        expect(row.get_by_test_id("tree-own")).to_have_text(f"{node['cost_micro_usd']:,}")
    deepest = tree.locator("[data-testid='tree-node'][data-depth='3']")
    expect(deepest).to_have_count(6)
    expect(page.get_by_test_id("final-answer")).to_contain_text("leaf:p leaf:q leaf:r |")
    shot(page, "nested")
