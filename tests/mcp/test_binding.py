"""MCP servers bound into kernels: real servers (the SDK's, and mcp-server-time from PyPI) over
stdio, streamable HTTP and SSE on loopback, called from real kernels."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import sunroom
from sunroom import AsyncKernel, Limits
from sunroom.errors import McpServerError, UsageError
from sunroom.mcp import from_config
from sunroom.mcp.servers import McpServer
from sunroom.sandbox.functions import host_function
from tests.canary import scan_code

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("no_process_left")]

SERVER = str(Path(__file__).with_name("toolserver.py"))
CANARY = "SRCANARY" + "5f0c1e9a7b3d4c2e8f6a9b1c0d2e3f4a"


def tracker(**options: Any) -> McpServer:
    return sunroom.mcp.stdio(
        sys.executable,
        [SERVER, "stdio"],
        name="tracker",
        env={"TOOLSERVER_TOKEN": CANARY},
        **options,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _http_server(mode: str) -> Iterator[int]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, SERVER, mode, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the {mode} test server did not listen")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
async def kernel() -> AsyncIterator[AsyncKernel]:
    async with AsyncKernel(backend="subprocess", mcp=[tracker()]) as k:
        yield k


async def value(k: AsyncKernel, code: str) -> str | None:
    result = await k.execute(code)
    assert result.ok, (result.error, result.stdout, result.stderr)
    return result.value


async def test_tools_are_a_module_with_real_signatures_and_help(kernel: AsyncKernel) -> None:
    assert await value(kernel, "tracker.add(2, 3)") == "5"
    assert await value(kernel, "tracker.add(a=2, b=40)") == "42"
    text = await value(kernel, "tracker.search_issues('bug', limit=2, labels=['ui'])")
    assert text == repr("#1 bug (open) [ui]\n#2 bug (open) [ui]")
    sig = await value(kernel, "import inspect; str(inspect.signature(tracker.search_issues))")
    assert sig is not None
    assert "query: str" in sig
    assert "limit: int = 5" in sig
    assert "state: Literal['open', 'closed'] = 'open'" in sig
    assert "labels: list[str] | None = None" in sig
    result = await kernel.execute("help(tracker.search_issues)")
    assert "Search issues by text." in result.stdout
    assert "Returns one line per match." in result.stdout
    assert "MCP tool 'search_issues' of the server 'tracker'" in result.stdout
    assert (
        await value(kernel, "type(tracker).__name__, tracker.__name__") == "('module', 'tracker')"
    )
    assert await value(kernel, "sorted(tracker.__all__)[:3]") == "['add', 'crash', 'create_issue']"


async def test_nested_objects_enums_and_structured_output(kernel: AsyncKernel) -> None:
    code = (
        "issue = tracker.create_issue("
        "NewIssue(title='Crash', author=Author(name='Ada'), tags=['p1']), priority='high')\n"
        "(type(issue).__name__, issue.number, issue.priority, issue.author.name, issue.tags)"
    )
    assert await value(kernel, code) == "('Issue', 7, 'high', 'Ada', ['p1'])"
    # plain dicts work for nested objects too; the enum default applies when omitted
    code = "tracker.create_issue({'title': 'x', 'author': {'name': 'B'}}).priority"
    assert await value(kernel, code) == "'low'"


async def test_arguments_are_checked_against_the_schema_on_the_host(kernel: AsyncKernel) -> None:
    result = await kernel.execute("tracker.search_issues(5)")
    assert result.error is not None
    assert result.error.type == "HostFunctionArgumentError"
    assert "5 is not of type 'string' at 'query'" in result.error.message
    result = await kernel.execute("tracker.search_issues('q', state='maybe')")
    assert result.error is not None
    assert "'maybe' is not one of ['open', 'closed']" in result.error.message
    result = await kernel.execute("tracker.add(1)")
    assert result.error is not None
    assert result.error.type == "TypeError"  # the real signature says b is missing


async def test_tool_errors_raise_a_typed_error_with_the_servers_message(
    kernel: AsyncKernel,
) -> None:
    code = (
        "from sunroom.prelude.mcp import McpToolError\n"
        "try:\n    tracker.fail('boom')\nexcept McpToolError as e:\n    caught = str(e)\ncaught"
    )
    assert await value(kernel, code) == repr("tracker.fail() failed: Error executing tool fail")


async def test_images_come_back_as_displayable_objects(kernel: AsyncKernel) -> None:
    result = await kernel.execute("tracker.red_square(size=3)")
    assert result.ok
    assert result.value is not None
    assert result.value.startswith("<Image image/png")
    assert [sorted(item.data) for item in result.outputs] == [["image/png", "text/plain"]]
    png = result.outputs[0].data["image/png"]
    assert isinstance(png, bytes)
    assert png.startswith(b"\x89PNG")


async def test_a_crashed_server_is_a_clear_error_and_restarts_at_the_next_call(
    kernel: AsyncKernel,
) -> None:
    first = await value(kernel, "tracker.pid()")
    result = await kernel.execute("tracker.crash()")
    assert result.error is not None
    assert result.error.type == "McpServerError"
    assert "exited during the call to crash()" in result.error.message
    assert "started again at the next call" in result.error.message
    second = await value(kernel, "tracker.pid()")
    assert second != first
    assert await value(kernel, "tracker.add(1, 1)") == "2"


async def test_a_hanging_tool_times_out_and_the_server_keeps_serving() -> None:
    async with AsyncKernel(backend="subprocess", mcp=[tracker(timeout_s=0.5)]) as k:
        started = time.monotonic()
        result = await k.execute("tracker.hang(30)")
        assert time.monotonic() - started < 10
        assert result.error is not None
        assert result.error.type == "HostFunctionTimeout"
        assert await value(k, "tracker.add(2, 2)") == "4"


async def test_results_over_the_cap_are_refused_with_the_numbers() -> None:
    async with AsyncKernel(backend="subprocess", mcp=[tracker(max_result_bytes=1_000_000)]) as k:
        assert await value(k, "len(tracker.flood(999_000))") == "999000"
        # over the result cap: read, measured, refused
        result = await k.execute("tracker.flood(1_200_000)")
        assert result.error is not None
        assert re.search(
            r"returned 1,200,\d{3} bytes, over the 1,000,000-byte cap", result.error.message
        )
        # a 50 MB answer is over the message cap (3x): dropped unread, the call fails at once
        before = psutil.Process().memory_info().rss
        started = time.monotonic()
        result = await k.execute("tracker.flood(50_000_000)")
        assert time.monotonic() - started < 20
        assert psutil.Process().memory_info().rss - before < 40_000_000
        assert result.error is not None
        assert result.error.type == "HostFunctionError"
        assert "over the message cap" in result.error.message
        assert "dropped unread" in result.error.message
        assert await value(k, "tracker.add(3, 4)") == "7"  # the same connection goes on


async def test_a_changed_tool_list_is_bound_again_before_the_next_cell(
    kernel: AsyncKernel,
) -> None:
    assert await value(kernel, "hasattr(tracker, 'fresh')") == "False"
    assert await value(kernel, "tracker.grow('fresh')") == "'added'"
    await asyncio.sleep(0.2)  # the notification arrives after the answer
    assert await value(kernel, "tracker.fresh()") == "'fresh'"
    assert await value(kernel, "tracker.add(5, 5)") == "10"


async def test_streamable_http_and_sse_servers() -> None:
    with _http_server("http") as port, _http_server("sse") as sse_port:
        servers = [
            sunroom.mcp.http(f"http://127.0.0.1:{port}/mcp", name="remote"),
            sunroom.mcp.http(f"http://127.0.0.1:{sse_port}/sse", name="older", transport="sse"),
        ]
        async with AsyncKernel(backend="subprocess", mcp=servers) as k:
            assert await value(k, "remote.add(20, 22)") == "42"
            assert await value(k, "older.add(1, 2)") == "3"
            assert (
                await value(
                    k, "remote.create_issue({'title': 't', 'author': {'name': 'a'}}).number"
                )
                == "7"
            )


async def test_a_third_party_server_from_pypi() -> None:
    exe = shutil.which("mcp-server-time", path=str(Path(sys.executable).parent))
    assert exe is not None, "mcp-server-time (a dev dependency) is not installed"
    server = sunroom.mcp.stdio(exe, ["--local-timezone", "UTC"], name="clock")
    async with AsyncKernel(backend="subprocess", mcp=[server]) as k:
        sig = await value(k, "import inspect; str(inspect.signature(clock.convert_time))")
        assert sig is not None
        assert "source_timezone: str" in sig
        code = (
            "clock.convert_time(source_timezone='UTC', time='12:00', target_timezone='Asia/Tokyo')"
        )
        result = await k.execute(code)
        assert result.ok, result.error
        assert result.value is not None
        assert "Asia/Tokyo" in result.value
        assert "21:00" in result.value


async def test_lazy_servers_start_before_the_first_cell() -> None:
    async with AsyncKernel(backend="subprocess", mcp=[tracker(start="lazy")]) as k:
        assert k.registry.functions.keys().isdisjoint({"tracker.add"})
        assert await value(k, "tracker.add(1, 2)") == "3"


async def test_a_server_that_cannot_start_is_a_clear_error() -> None:
    bad = sunroom.mcp.stdio(sys.executable, ["-c", "raise SystemExit(7)"], name="broken")
    kernel = AsyncKernel(backend="subprocess", mcp=[bad])
    with pytest.raises(McpServerError, match="the MCP server 'broken' could not be started"):
        await kernel.start()
    await kernel.aclose()
    lazy = sunroom.mcp.stdio(
        sys.executable, ["-c", "raise SystemExit(7)"], name="broken", start="lazy"
    )
    async with AsyncKernel(backend="subprocess", mcp=[lazy]) as k:
        # the first cell is refused with the reason; the kernel and later cells are unharmed
        first = await k.execute("x = 41")
        assert first.error is not None
        assert first.error.type == "McpServerError"
        assert "could not be started" in first.error.message
        await value(k, "x = 41")
        result = await k.execute("x + 1")
        assert result.ok, result.error
        assert result.value == "42"
        result = await k.execute("broken")
        assert result.error is not None
        assert result.error.type == "NameError"


async def test_bad_descriptions_are_refused_before_anything_starts() -> None:
    with pytest.raises(UsageError, match="must be a Python identifier"):
        sunroom.mcp.stdio("x", name="no-dashes")
    with pytest.raises(UsageError, match="args must be a list"):
        sunroom.mcp.stdio("x", "--flag")
    with pytest.raises(UsageError, match="url must start with http"):
        sunroom.mcp.http("ftp://example", name="x")
    with pytest.raises(UsageError, match="is a builtin"):
        AsyncKernel(mcp=[sunroom.mcp.stdio("x", name="print")])
    with pytest.raises(UsageError, match="same name"):
        AsyncKernel(mcp=[tracker(), tracker()])

    same = host_function(lambda: 1, name="tracker")
    k = AsyncKernel(backend="subprocess", functions=[same], mcp=[tracker()])
    try:
        with pytest.raises(UsageError, match="names both a host function and a module"):
            await k.start()
    finally:
        await k.aclose()


async def test_config_files_in_the_common_mcpservers_shape() -> None:
    servers = from_config(
        {
            "mcpServers": {
                "issue-tracker": {"command": "python3", "args": ["s.py"], "env": {"T": "secret"}},
                "remote": {
                    "url": "http://127.0.0.1:1/mcp",
                    "headers": {"Authorization": "Bearer abcd1234"},
                },
                "old": {"url": "http://127.0.0.1:1/sse", "type": "sse", "timeout_s": 5},
            }
        }
    )
    assert [s.name for s in servers] == ["issue_tracker", "remote", "old"]
    assert "secret" not in repr(servers)
    assert "abcd1234" not in repr(servers)
    assert servers[1].secrets() == ("Bearer abcd1234", "abcd1234")
    with pytest.raises(UsageError, match="give 'command'"):
        from_config({"mcpServers": {"x": {"cmd": "y"}}})


async def test_credentials_never_reach_the_kernel(isolated_backend: str) -> None:
    """A canary given to the server (env) is nowhere in the sandbox: env, files, /proc, memory."""
    async with AsyncKernel(
        backend=isolated_backend, mcp=[tracker()], limits=Limits(timeout_s=120)
    ) as k:
        assert await value(k, "tracker.add(1, 2)") == "3"
        code = scan_code(r"SRCANARY[0-9a-f]{32}")
        result = await k.execute(code)
        assert result.ok, result.error
        assert result.value == "([], True)"
        assert CANARY not in result.stdout + result.stderr
    assert os.environ.get("TOOLSERVER_TOKEN") is None


async def test_a_server_flooding_stderr_costs_no_memory_and_its_last_line_is_quoted_masked(
    kernel: AsyncKernel,
) -> None:
    before = psutil.Process().memory_info().rss
    assert await value(kernel, "tracker.shout(50_000_000)") == "'ok'"  # 50 MB of stderr
    assert psutil.Process().memory_info().rss - before < 20_000_000
    result = await kernel.execute(f"tracker.shout(1000, last='die: token {CANARY}')")
    assert result.error is not None
    assert result.error.type == "McpServerError"
    assert "its last stderr line: die: token ***" in result.error.message
    assert CANARY not in result.error.message
    assert await value(kernel, "tracker.add(1, 1)") == "2"


async def test_a_per_tool_budget_and_concurrency_limit() -> None:
    async with AsyncKernel(backend="subprocess", mcp=[tracker(budget=2)]) as k:
        assert await value(k, "tracker.add(1, 1), tracker.add(2, 2)") == "(2, 4)"
        result = await k.execute("tracker.add(3, 3)")
        assert result.error is not None
        assert result.error.type == "HostFunctionBudgetExceeded"
        assert await value(k, "tracker.pid() > 0") == "True"  # each tool has its own count
    async with AsyncKernel(backend="subprocess", mcp=[tracker(max_concurrency=1)]) as k:
        code = (
            "import threading, time\n"
            "t0 = time.monotonic()\n"
            "ts = [threading.Thread(target=tracker.hang, args=(0.3,)) for _ in range(3)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
            "round(time.monotonic() - t0, 1) >= 0.9"
        )
        assert await value(k, code) == "True"  # one at a time
