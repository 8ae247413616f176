"""The E2B facade driven by the unmodified ``e2b-code-interpreter`` SDK, on a real server.

Each test starts ``sunroom serve`` (uvicorn on 127.0.0.1, bwrap kernels) and points the SDK at
it through its own environment variables, as a user does: ``E2B_API_URL``,
``E2B_SANDBOX_URL`` and ``E2B_API_KEY``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from e2b import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    SandboxQuery,
    TimeoutException,
)
from e2b_code_interpreter import AsyncSandbox, OutputMessage, Sandbox

from tests.service.conftest import TOKEN, Server

pytestmark = pytest.mark.kernel


@pytest.fixture
def server(make_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch) -> Server:
    srv = make_server(backend="bwrap")
    monkeypatch.setenv("E2B_API_URL", srv.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", srv.url)
    monkeypatch.setenv("E2B_API_KEY", TOKEN)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    return srv


@pytest.fixture
def sandbox(server: Server) -> Iterator[Sandbox]:
    sb = Sandbox.create(timeout=120, metadata={"suite": "sunroom"})
    yield sb
    sb.kill()


def test_code_runs_with_state_streams_and_errors_as_e2b_reports_them(sandbox: Sandbox) -> None:
    assert sandbox.run_code("x = 1; x").text == "1"
    assert sandbox.run_code("x += 1; x").text == "2"  # the same namespace
    out: list[OutputMessage] = []
    err: list[OutputMessage] = []
    run = sandbox.run_code(
        "import sys\nprint('a')\nprint('b', file=sys.stderr)\n'quoted'",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert [m.line for m in out] == ["a\n"] and run.logs.stdout == ["a\n"]
    assert [m.line for m in err] == ["b\n"] and err[0].error
    assert run.text == "quoted"  # E2B drops a string repr's quotes
    failed = sandbox.run_code("undefined_name")
    assert failed.error is not None and failed.error.name == "NameError"
    assert "undefined_name" in failed.error.traceback
    assert failed.execution_count == 4  # every execution counts, a failed one too
    indented = sandbox.run_code("\n    y = 40\n    y + 2\n")  # IPython runs indented cells
    assert indented.text == "42"


def test_a_figure_is_a_png_result_and_envs_hold_for_one_execution(server: Server) -> None:
    sb = Sandbox.create(envs={"SANDBOX_VAR": "base"})
    try:
        fig = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
        assert fig.results and fig.results[0].png and not fig.results[0].is_main_result
        read = "import os; os.getenv('SANDBOX_VAR', 'unset'), os.getenv('ONE', 'unset')"
        assert sb.run_code(read).text == "('base', 'unset')"
        once = sb.run_code(read, envs={"SANDBOX_VAR": "over", "ONE": "1"})
        assert once.text == "('over', '1')"
        assert sb.run_code(read).text == "('base', 'unset')"  # both restored
        frame = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2, 3]})")
        (main,) = frame.results
        assert main.is_main_result and main.data == {"a": [1, 2, 3]} and main.html
        assert sb.run_code("{'k': [1, 2]}").results[0].json == {"k": [1, 2]}
        raw = sb.run_code("display({'text/latex': r'\\alpha'}, raw=True)")
        assert raw.results[0].formats() == ["latex"]
    finally:
        sb.kill()


def test_contexts_are_separate_namespaces_that_restart_and_go(sandbox: Sandbox) -> None:
    sandbox.run_code("shared = 1")
    ctx = sandbox.create_code_context()
    assert ctx.language == "python" and ctx.cwd
    missing = sandbox.run_code("shared", context=ctx)
    assert missing.error is not None and missing.error.name == "NameError"
    sandbox.run_code("mine = 5", context=ctx)
    assert sandbox.run_code("mine", context=ctx).text == "5"
    assert ctx.id in [c.id for c in sandbox.list_code_contexts()]
    sandbox.restart_code_context(ctx)
    gone = sandbox.run_code("mine", context=ctx)
    assert gone.error is not None and gone.error.value == "name 'mine' is not defined"
    sandbox.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sandbox.run_code("1", context=ctx)
    with pytest.raises(SandboxException, match="501"):
        sandbox.run_code("console.log(1)", language="js")


def test_a_client_that_gives_up_interrupts_the_cell_and_the_context_keeps_its_state(
    sandbox: Sandbox,
) -> None:
    sandbox.run_code("kept = 'yes'")
    with pytest.raises(TimeoutException):
        sandbox.run_code("import time\ntime.sleep(300)", timeout=2)
    after = sandbox.run_code("kept", timeout=30)  # not queued behind the 300 s sleep
    assert after.text == "yes"


def test_a_sandbox_killed_under_a_running_cell_is_reported_as_killed(server: Server) -> None:
    sb = Sandbox.create()
    timer = threading.Timer(1.5, sb.kill)
    timer.start()
    try:
        with pytest.raises(TimeoutException, match="sandbox was killed"):
            sb.run_code("import time\ntime.sleep(300)", timeout=120)
    finally:
        timer.cancel()
    assert not sb.is_running()
    assert Sandbox.kill(sb.sandbox_id) is False  # already gone: 404, not an error


def test_a_kernel_that_dies_is_reported_and_the_sandbox_comes_back_as_it_was(
    server: Server,
) -> None:
    sb = Sandbox.create(envs={"KEEP": "kept"})
    try:
        sb.run_code("lost = 1")
        died = sb.run_code("import os\nos._exit(3)")
        assert died.error is not None
        after = sb.run_code("import os\nos.environ['KEEP'], 'lost' in globals()")
        assert after.text == "('kept', False)"  # a new kernel, set up as the sandbox asked
        too_big = "x = 1\n" * 200_000  # over the server's 1 MiB body limit
        with pytest.raises(SandboxException, match="413 .*over the limit of 1048576 bytes"):
            sb.run_code(too_big)
    finally:
        sb.kill()


def test_a_sandbox_ends_at_its_timeout_and_set_timeout_moves_the_end(server: Server) -> None:
    short = Sandbox.create(timeout=1)
    kept = Sandbox.create(timeout=1)
    kept.set_timeout(60)
    deadline = time.monotonic() + 15
    while short.is_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not short.is_running()
    assert kept.is_running()
    ids = {s.sandbox_id for s in Sandbox.list().next_items()}
    assert kept.sandbox_id in ids and short.sandbox_id not in ids
    kept.kill()


def test_the_control_plane_lists_filters_pages_and_reconnects(server: Server) -> None:
    a = Sandbox.create(metadata={"team": "a"})
    b = Sandbox.create(metadata={"team": "b"})
    try:
        only_a = Sandbox.list(query=SandboxQuery(metadata={"team": "a"})).next_items()
        assert [s.sandbox_id for s in only_a] == [a.sandbox_id]
        pages = Sandbox.list(limit=1)
        first = pages.next_items()
        assert len(first) == 1 and pages.has_next
        second = pages.next_items()
        assert {first[0].sandbox_id, second[0].sandbox_id} == {a.sandbox_id, b.sandbox_id}
        info = a.get_info()
        assert info.metadata == {"team": "a"} and info.template_id == "code-interpreter-v1"
        a.run_code("left = 'here'")
        again = Sandbox.connect(a.sandbox_id)
        assert again.run_code("left").text == "here"
    finally:
        a.kill()
        b.kill()


def test_what_is_not_covered_is_refused_with_a_clear_501(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="does not cover"):
        sandbox.pause()
    with pytest.raises(SandboxException, match="internet access"):
        Sandbox.create(allow_internet_access=True)
    with pytest.raises(SandboxException, match="404: template 'no-such-template' not found"):
        Sandbox.create("no-such-template")


def test_credentials_are_checked_on_every_route(server: Server, sandbox: Sandbox) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="wrong-key-0123456789")
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        body = {"code": "1"}
        assert http.post("/execute", json=body, headers=headers).status_code == 401
        wrong = {**headers, "X-Access-Token": "not-the-token"}
        assert http.post("/execute", json=body, headers=wrong).status_code == 401
        other = Sandbox.create()
        try:  # another sandbox's tokens open nothing here
            theirs = {**headers, "X-Access-Token": other._envd_access_token}
            assert http.post("/execute", json=body, headers=theirs).status_code == 401
            traffic = {**headers, "E2B-Traffic-Access-Token": other.traffic_access_token}
            assert http.get("/contexts", headers=traffic).status_code == 401
        finally:
            other.kill()
        gone = {**headers, "E2b-Sandbox-Id": "sr-nope", "X-Access-Token": "x"}
        answer = http.post("/execute", json=body, headers=gone)
        assert answer.status_code == 502 and "was not found" in answer.text
        assert http.get("/v2/sandboxes").status_code == 401
        listed = http.get("/v2/sandboxes", headers={"X-API-KEY": TOKEN})
        assert listed.status_code == 200
        assert "envdAccessToken" not in listed.text  # tokens only on create and connect


def test_the_facade_answers_under_e2b_too(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_URL", server.url + "/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", server.url + "/e2b")
    sb = Sandbox.create()
    try:
        assert sb.run_code("6 * 7").text == "42"
    finally:
        sb.kill()


async def test_the_async_sdk_runs_code_and_contexts(server: Server) -> None:
    sb = await AsyncSandbox.create()
    try:
        seen: list[str] = []

        async def collect(message: OutputMessage) -> None:
            seen.append(message.line)

        run = await sb.run_code("for i in range(3): print(i)", on_stdout=collect)
        assert "".join(seen) == "0\n1\n2\n" and run.error is None
        ctx = await sb.create_code_context()
        results = await asyncio.gather(
            sb.run_code("a = 1; a"), sb.run_code("a = 2; a", context=ctx)
        )
        assert [r.text for r in results] == ["1", "2"]
        assert len(await sb.list_code_contexts()) == 2
    finally:
        await sb.kill()


def test_smolagents_e2b_executor_runs_against_sunroom_unchanged(server: Server) -> None:
    from smolagents.default_tools import FinalAnswerTool
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import E2BExecutor

    executor = E2BExecutor(additional_imports=[], logger=AgentLogger(LogLevel.OFF))
    try:
        executor.send_tools({"final_answer": FinalAnswerTool()})
        plain = executor.run_code_raise_errors("x = 6\nprint('hi')\nx * 7")
        assert plain.output == "42" and "hi" in plain.logs and not plain.is_final_answer
        final: Any = executor.run_code_raise_errors("final_answer(x * 2)")
        assert final.is_final_answer and final.output == 12
    finally:
        executor.cleanup()
