"""The web view's speed in headless Chromium: first view, tree expand, live latency.

Starts ``sunroom serve`` (a real subprocess, scripted models) and drives Debian's Chromium
through Playwright, logged in like a person. Three figures, each a median with p90 and max:

* **first view**: a finished session whose run made ``--items`` sub-calls in one
  ``predict_many`` (about 3 events per sub-call: over 6,000 events for 2,000 items) is opened
  in a fresh page; the time from navigation start until the page marked its first complete
  render (``window.sunroomTimings.firstView``). Target: <= 1 s.
* **expand**: the ``predict_many`` node of that session's recursion tree (``--items``
  children) is collapsed and expanded again; the time from the click to the second animation
  frame after it (layout and paint included). Target: <= 100 ms.
* **live**: a running session prints a line every 50 ms for 3 s while the page is open; for
  each event that arrived over SSE, the time from its ``ts`` (stamped when it was published,
  before the store wrote it) to the moment the page had it in the DOM
  (``sunroomTimings.seen``). Target: <= 200 ms.

    .venv/bin/python benchmarks/webview.py [--items 2000] [--repeat 7] [--backend subprocess]

The server, its kernels and the browser share the machine's cores (2 on the development VM).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
from playwright.sync_api import Page, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _server import serve  # noqa: E402

LIVE_CELL = (
    "import time\n"
    "for i in range(60):\n"
    "    print('tick', i, flush=True)\n"
    "    time.sleep(0.05)\n"
    "submit('ok')"
)


def _script(items: int) -> dict[str, object]:
    """A scripted model: one big fan-out, then a live printing cell on the next message."""
    fan_out = f"r = predict_many('echo', [str(i) for i in range({items})])\nprint(len(r))"
    return {
        "replies": [{"code": fan_out}, "fanned out", {"code": LIVE_CELL}, "done"],
        "sub_reply": "ok",
    }


def _summary(values: Sequence[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return (
        f"median {statistics.median(ordered):7.1f} ms   p90 {p90:7.1f} ms   "
        f"max {ordered[-1]:7.1f} ms   (n={len(ordered)})"
    )


def _wait_ended(client: httpx.Client, sid: str, timeout_s: float = 600) -> None:
    answer = client.get(f"/sessions/{sid}/result", params={"timeout": timeout_s})
    answer.raise_for_status()
    if answer.json()["status"] == "running":
        raise RuntimeError("the session did not end in time")


def _open(page: Page, url: str, sid: str) -> float:
    page.goto(f"{url}/#/sessions/{sid}")
    page.wait_for_selector("[data-ready='1']", timeout=60_000)
    first: float = page.evaluate("window.sunroomTimings.firstView")
    return first


def _expand_once(page: Page, node: str) -> float:
    took: float = page.evaluate(
        """async (node) => {
            const row = document.querySelector(`[data-testid='tree-node'][data-node='${node}']`);
            const toggle = row.querySelector("[data-testid='tree-toggle']");
            const t0 = performance.now();
            toggle.click();
            await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
            return performance.now() - t0;
        }""",
        node,
    )
    return took


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000, help="sub-calls of the big session")
    parser.add_argument("--repeat", type=int, default=7, help="page loads and expands measured")
    parser.add_argument("--backend", default="subprocess")
    parser.add_argument(
        "--chromium", default=os.environ.get("SUNROOM_CHROMIUM", "/usr/bin/chromium")
    )
    args = parser.parse_args(argv)
    script = Path(tempfile.mkdtemp(prefix="sunroom-webview-")) / "script.json"
    script.write_text(json.dumps(_script(args.items)))
    with serve("--model", f"scripted:{script}", "--backend", args.backend) as server:
        client = httpx.Client(base_url=server.url, headers=server.headers, timeout=700)
        started = time.perf_counter()
        sid = client.post("/sessions", json={"task": "fan out"}).json()["session_id"]
        _wait_ended(client, sid)
        log = client.get(f"/ui/api/sessions/{sid}/log", headers=server.headers).json()
        events = len(log["events"])
        nodes = [e for e in log["events"] if e["type"] == "SubCallEnded"]
        call_id = nodes[0]["call_id"]
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}; server backend {args.backend}")  # fmt: skip
        print(f"session: {events} events, {len(nodes)} sub-calls "
              f"(built in {time.perf_counter() - started:.1f} s)")  # fmt: skip
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=args.chromium, headless=True, args=["--no-sandbox"]
            )
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.goto(server.url + "/")
            page.get_by_test_id("login-token").fill(server.token)
            page.get_by_test_id("login-submit").click()
            page.wait_for_selector("body[data-view='list']", state="attached")
            _open(page, server.url, sid)  # warm: the files are cached from here on
            firsts = []
            for _ in range(args.repeat):
                fresh = context.new_page()
                firsts.append(_open(fresh, server.url, sid))
                fresh.close()
            print(f"first view ({events} events):        {_summary(firsts)}   target <= 1000 ms")
            _open(page, server.url, sid)
            parent = page.locator(
                "[data-testid='tree-node'][data-depth='1']", has_text="predict_many"
            ).first
            node = parent.get_attribute("data-node")
            assert node is not None
            expands = []
            for _ in range(args.repeat * 3):
                took = _expand_once(page, node)  # expand or collapse, alternately
                expanded = page.locator("[data-testid='tree-node'][data-depth='2']").count()
                if expanded:
                    expands.append(took)
            print(f"expand a node of {len(nodes)} children: {_summary(expands)}   target <= 100 ms")
            # live: a second run of the same session, followed by the open page
            client.post(f"/sessions/{sid}/messages", json={"text": "print live"})
            _wait_ended(client, sid)
            time.sleep(0.5)
            seen: dict[str, float] = page.evaluate("window.sunroomTimings.seen")
            after = client.get(
                f"/ui/api/sessions/{sid}/log", params={"after": log["last_seq"]},
                headers=server.headers,
            ).json()["events"]  # fmt: skip
            lags = [seen[str(e["seq"])] - e["ts"] * 1000 for e in after if str(e["seq"]) in seen]
            missing = len([e for e in after if str(e["seq"]) not in seen])
            print(f"live: event written -> in the page: {_summary(lags)}   target <= 200 ms "
                  f"({missing} of {len(after)} events not recorded by the page)")  # fmt: skip
            print(f"(call {call_id}: {len(nodes)} children)")
            browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
