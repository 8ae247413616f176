"""``sunroom mcp`` driven by the official MCP SDK client, over stdio and streamable HTTP.

Every server is a real ``python -m sunroom.cli mcp`` process; the HTTP ones listen on
127.0.0.1 with a free port.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import psutil
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "test-token-" + "x" * 24


def server_env(**extra: str) -> dict[str, str]:
    """The environment of a server: this checkout importable, no model or token inherited."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SUNROOM_MODEL", "SUNROOM_BASE_URL", "SUNROOM_TOKEN", "SUNROOM_BACKEND")
    }
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def stdio(
    *args: str, command: str = sys.executable, env: dict[str, str] | None = None, mode: str = "auto"
) -> Client:
    """A client of ``sunroom mcp ARGS`` spawned over stdio (as ``python -m sunroom.cli``).

    *mode* ``auto`` speaks the 2026-07-28 protocol (the server offers it on stdio);
    ``legacy`` the initialize handshake.
    """
    argv = ["-m", "sunroom.cli", "mcp", *args] if command == sys.executable else list(args)
    params = StdioServerParameters(command=command, args=argv, env=env or server_env(), cwd=ROOT)
    return Client(params, mode=mode)


@contextmanager
def http_server(*args: str, token: str = TOKEN) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``sunroom mcp --http --port 0 ARGS`` running: its URL and process; stopped after."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sunroom.cli", "mcp", "--http", "--port", "0", *args],
        env=server_env(SUNROOM_TOKEN=token),
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.match(r"sunroom mcp listening on (http://127\.0\.0\.1:\d+/mcp)$", line.strip())
        assert match, f"unexpected first line {line!r}"
        assert proc.stdout.readline().strip() == "token: from SUNROOM_TOKEN"
        yield match.group(1), proc
    finally:
        proc.terminate()
        code = proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0  # SIGTERM: a clean stop (the kernels closed in the lifespan)


@asynccontextmanager
async def http_client(url: str, token: str = TOKEN) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def kernel_pids(server: subprocess.Popen[str]) -> set[int]:
    """The live processes under *server* (its kernels and their supervisors)."""
    out = set()
    for p in psutil.Process(server.pid).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_until(check: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return bool(check())


# -- stdio ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_process_left")
async def test_stdio_state_images_errors_timeout_reset() -> None:
    async with stdio("--backend", "subprocess", "--max-timeout", "60") as client:
        assert client.session.protocol_version == "2026-07-28"  # stdio: one client, any era
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {
            "execute_code",
            "reset_kernel",
            "list_files",
            "read_file",
            "write_file",
        }  # no run_agent without a model
        execute = tools["execute_code"]
        assert execute.input_schema["required"] == ["code"]
        assert execute.input_schema["properties"]["timeout_s"]["maximum"] == 60
        assert execute.output_schema is not None
        assert "1000000 bytes per stream" in (execute.description or "")

        r = await client.call_tool("execute_code", {"code": "x = 41\nprint('hi')\nx + 1"})
        assert not r.is_error
        assert r.structured_content is not None
        assert r.structured_content["value"] == "42"
        assert r.structured_content["stdout"] == "hi\n"
        assert text_of(r) == "[stdout]\nhi\n[value]\n42"

        r = await client.call_tool(
            "execute_code",
            {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nprint(x)"},
        )
        assert not r.is_error, text_of(r)
        images = [c for c in r.content if isinstance(c, types.ImageContent)]
        assert len(images) == 1 and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
        assert r.structured_content is not None
        assert "image/png" in r.structured_content["outputs"][0]["mime_types"]

        r = await client.call_tool("execute_code", {"code": "def f():\n    return 1 / 0\nf()"})
        assert r.is_error
        assert "ZeroDivisionError: division by zero" in text_of(r)
        assert r.structured_content is not None
        assert r.structured_content["status"] == "error"
        assert r.structured_content["error"]["type"] == "ZeroDivisionError"

        started = time.monotonic()
        r = await client.call_tool("execute_code", {"code": "while True: pass", "timeout_s": 1})
        assert time.monotonic() - started < 10
        assert r.is_error and r.structured_content is not None
        assert r.structured_content["status"] == "timeout"
        assert "past its 1 s limit" in text_of(r)
        r = await client.call_tool("execute_code", {"code": "x"})
        assert r.structured_content is not None
        assert r.structured_content["value"] == "41"  # the interrupt kept the state

        for bad in ({"code": "1", "timeout_s": 0}, {"code": "1", "timeout_s": 61}, {}):
            r = await client.call_tool("execute_code", bad)
            assert r.is_error and text_of(r).startswith("invalid arguments: "), text_of(r)

        with pytest.raises(MCPError, match="there is no tool named 'nope'"):
            await client.call_tool("nope", {})

        r = await client.call_tool("reset_kernel", {})
        assert not r.is_error and r.structured_content == {"closed": True}
        r = await client.call_tool("execute_code", {"code": "x"})
        assert r.is_error and "NameError" in text_of(r)


@pytest.mark.usefixtures("no_process_left")
async def test_stdio_files_jailed_text_and_binary() -> None:
    async with stdio("--backend", "subprocess", "--max-file-bytes", "1000") as client:
        r = await client.call_tool("write_file", {"path": "notes/a.txt", "content": "héllo\n"})
        assert not r.is_error, text_of(r)
        assert r.structured_content == {"path": "notes/a.txt", "bytes_written": 7}
        png = b"\x89PNG\r\n\x1a\n\x00\xff"
        payload = {"path": "b.bin", "content": base64.b64encode(png).decode(), "encoding": "base64"}
        r = await client.call_tool("write_file", payload)
        assert not r.is_error, text_of(r)
        r = await client.call_tool(
            "execute_code", {"code": "open('c.txt', 'w').write('from code')"}
        )
        assert not r.is_error

        r = await client.call_tool("list_files", {})
        assert r.structured_content is not None
        listed = {f["path"]: f for f in r.structured_content["files"]}
        assert set(listed) == {"notes", "notes/a.txt", "b.bin", "c.txt"}
        assert listed["notes"]["is_dir"] and listed["b.bin"]["size"] == len(png)
        r = await client.call_tool("list_files", {"glob": "*.txt"})
        assert r.structured_content is not None
        assert [f["path"] for f in r.structured_content["files"]] == ["c.txt"]

        r = await client.call_tool("read_file", {"path": "notes/a.txt"})
        assert text_of(r) == "héllo\n"
        assert r.structured_content is not None
        assert r.structured_content["encoding"] == "utf-8"
        assert r.structured_content["size"] == 7
        r = await client.call_tool("read_file", {"path": "b.bin"})
        assert not r.is_error
        (block,) = r.content
        assert isinstance(block, types.EmbeddedResource)
        assert isinstance(block.resource, types.BlobResourceContents)
        assert base64.b64decode(block.resource.blob) == png
        assert r.structured_content is not None
        assert r.structured_content["encoding"] == "base64"

        for path in ("../escape.txt", "/etc/passwd", "notes/../../x"):
            for tool, args in (
                ("read_file", {"path": path}),
                ("write_file", {"path": path, "content": "x"}),
            ):
                r = await client.call_tool(tool, args)
                assert r.is_error, (tool, path)
                assert r.structured_content is None
        r = await client.call_tool("read_file", {"path": "../escape.txt"})
        assert text_of(r) == "the path must not contain a '..' component"
        r = await client.call_tool("read_file", {"path": "missing.txt"})
        assert r.is_error

        r = await client.call_tool("write_file", {"path": "big.txt", "content": "x" * 1001})
        assert r.is_error and "over the cap of 1000" in text_of(r)
        await client.call_tool("execute_code", {"code": "open('big.txt', 'w').write('y' * 1001)"})
        r = await client.call_tool("read_file", {"path": "big.txt"})
        assert r.is_error and text_of(r) == "big.txt is 1001 bytes, over the cap of 1000"


@pytest.mark.parametrize("isolated_backend", ["bwrap"], indirect=True)
@pytest.mark.usefixtures("no_process_left")
async def test_stdio_bwrap_kernel(isolated_backend: str) -> None:
    async with stdio("--backend", isolated_backend, mode="legacy") as client:
        assert client.session.initialize_result is not None  # the handshake era
        await client.call_tool("execute_code", {"code": "import os\nn = 5"})
        r = await client.call_tool("execute_code", {"code": "n * 2"})
        assert r.structured_content is not None and r.structured_content["value"] == "10"
        r = await client.call_tool(
            "execute_code",
            {"code": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)"},
        )
        assert r.is_error  # no network in the sandbox


@pytest.mark.usefixtures("no_process_left")
async def test_stdio_run_agent_with_a_scripted_model() -> None:
    script = "scripted:examples/replies.json"
    async with stdio("--backend", "subprocess", "--model", script) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        schema = tools["run_agent"].input_schema
        assert schema["required"] == ["task"]
        allowed = schema["properties"]["model"]["anyOf"][0]  # one model: a const
        assert allowed.get("enum", [allowed.get("const")]) == [
            f"scripted:{ROOT / 'examples/replies.json'}"
        ]
        r = await client.call_tool("run_agent", {"task": "What is the 20th Fibonacci number?"})
        assert not r.is_error, text_of(r)
        assert text_of(r) == "The 20th Fibonacci number is 6765."
        assert r.structured_content is not None
        assert r.structured_content["status"] == "success"
        assert r.structured_content["turns"] == 2
        r = await client.call_tool("run_agent", {"task": "x", "model": "openai:gpt-5"})
        assert r.is_error and text_of(r).startswith("invalid arguments: model: ")


def test_stdio_prints_nothing_but_frames_and_fails_closed() -> None:
    # a client that sends nothing: the server must not write a byte to stdout
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "mcp", "--backend", "subprocess"],
        input="",
        capture_output=True,
        text=True,
        env=server_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "mcp", "--backend", "nope"],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr
        == "sunroom: unknown backend 'nope'; choose one of subprocess, bwrap, docker, jupyter\n"
    )


# -- streamable HTTP ------------------------------------------------------------------------


@pytest.mark.usefixtures("no_process_left")
async def test_http_sessions_are_isolated_and_their_kernels_closed() -> None:
    with http_server("--backend", "subprocess") as (url, proc):
        gate = asyncio.Event()

        async def session(name: str) -> str:
            async with http_client(url) as client:
                code = f"secret = {name!r}\nmine_{name} = 1"
                await client.call_tool("execute_code", {"code": code})
                gate.set()
                await gate.wait()
                await asyncio.sleep(0.3)  # both kernels exist and both cells ran by now
                r = await client.call_tool(
                    "execute_code",
                    {"code": "sorted(k for k in globals() if k.startswith('mine_'))"},
                )
                assert r.structured_content is not None
                assert r.structured_content["value"] == repr([f"mine_{name}"])
                await client.call_tool("write_file", {"path": f"{name}.txt", "content": name})
                files = await client.call_tool("list_files", {})
                assert files.structured_content is not None
                assert [f["path"] for f in files.structured_content["files"]] == [f"{name}.txt"]
                mine = await client.call_tool("execute_code", {"code": "secret"})
                assert mine.structured_content is not None
                return str(mine.structured_content["value"])

        assert list(await asyncio.gather(session("a"), session("b"))) == ["'a'", "'b'"]
        # both sessions ended (the client sends DELETE): their kernels are gone, the server is not
        assert wait_until(lambda: not kernel_pids(proc)), kernel_pids(proc)
        assert proc.poll() is None

        async with http_client(url) as client:  # a third session starts from scratch
            r = await client.call_tool("execute_code", {"code": "secret"})
            assert r.is_error and "NameError" in text_of(r)
            assert kernel_pids(proc)
        assert wait_until(lambda: not kernel_pids(proc))


@pytest.mark.usefixtures("no_process_left")
async def test_http_needs_the_token() -> None:
    with http_server("--backend", "subprocess") as (url, _):
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx.AsyncClient() as http:
            for auth in (
                {},
                {"Authorization": "Bearer wrong-token-wrong-token"},
                {"Authorization": TOKEN},
            ):
                resp = await http.post(url, json=body, headers=headers | auth)
                assert resp.status_code == 401, resp.text
                assert resp.headers["www-authenticate"] == "Bearer"
                assert TOKEN not in resp.text
            resp = await http.post(url, json=body, headers=headers | {"Host": "evil.example"})
            assert resp.status_code == 400
        with pytest.raises(Exception):  # noqa: B017, PT011 - the SDK's error for a 401
            async with http_client(url, token="wrong-token-wrong-token") as client:
                await client.list_tools()
        async with http_client(url) as client:
            # the SDK's client probed server/discover and fell back to the handshake
            assert client.session.protocol_version == "2025-11-25"
            r = await client.call_tool("execute_code", {"code": "6 * 7"})
            assert r.structured_content is not None and r.structured_content["value"] == "42"
            # the request body cap follows --max-file-bytes (8 MiB): a 6 MiB file fits in one
            big = base64.b64encode(os.urandom(6 * 1024 * 1024)).decode()
            args = {"path": "big.bin", "content": big, "encoding": "base64"}
            r = await client.call_tool("write_file", args)
            assert not r.is_error, text_of(r)
            assert r.structured_content == {"path": "big.bin", "bytes_written": 6 * 1024 * 1024}
        # a stateless (2026-07-28) call has no session to keep a kernel in: refused
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with create_mcp_http_client(headers=headers) as http:
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode="2026-07-28") as stateless:
                with pytest.raises(MCPError, match="keeps a kernel per MCP session"):
                    await stateless.call_tool("execute_code", {"code": "1"})


@pytest.mark.usefixtures("no_process_left")
async def test_http_unknown_paths_are_json_problems() -> None:
    """Issue 26, item 7: a path other than /mcp was answered in plain text."""
    with http_server("--backend", "subprocess") as (url, _):
        base = url.removesuffix("/mcp")
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(headers=headers) as http:
            for path in ("/", "/nope", "/mcp/extra", "/sessions/x"):
                resp = await http.get(base + path)
                assert resp.status_code == 404, (path, resp.text)
                assert resp.headers["content-type"] == "application/json", path
                error = resp.json()["error"]
                assert set(error) == {"type", "message"}
                assert "/mcp" in error["message"] and path not in error["message"].split()


@pytest.mark.usefixtures("no_process_left")
async def test_http_session_cap_and_idle_end() -> None:
    with http_server("--backend", "subprocess", "--max-sessions", "1", "--session-idle", "2") as (
        url,
        proc,
    ):
        async with http_client(url) as first:
            await first.call_tool("execute_code", {"code": "1"})
            with pytest.raises(Exception):  # noqa: B017, PT011 - 503 from the session cap
                async with http_client(url) as second:
                    await second.list_tools()
        # a client that goes away without ending its session (no DELETE): once it has been
        # idle for --session-idle, the session ends and its kernel is closed
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with create_mcp_http_client(headers=headers) as http:
            transport = streamable_http_client(url, http_client=http, terminate_on_close=False)
            async with Client(transport) as client:  # the first one ended: room again
                await client.call_tool("execute_code", {"code": "x = 1"})
        assert kernel_pids(proc)
        assert wait_until(lambda: not kernel_pids(proc), timeout=15)
        assert proc.poll() is None


def test_http_refuses_a_non_loopback_host_without_expose() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "mcp", "--http", "--host", "0.0.0.0"],  # noqa: S104
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert "is not a loopback address: pass --expose" in proc.stderr


# -- the documented client configuration ----------------------------------------------------


def doc_servers() -> dict[str, Any]:
    """The ``mcpServers`` entries of the JSON blocks under docs/mcp.md's server section."""
    text = (ROOT / "docs" / "mcp.md").read_text()
    section = text.split("## sunroom as an MCP server", 1)[1].split("\n## ", 1)[0]
    servers: dict[str, Any] = {}
    for block in re.findall(r"```json\n(.*?)```", section, flags=re.S):
        servers.update(json.loads(block)["mcpServers"])
    return servers


@pytest.mark.usefixtures("no_process_left")
async def test_the_documented_mcp_servers_entries_work() -> None:
    servers = doc_servers()
    assert set(servers) == {"sunroom", "sunroom-http"}

    entry = servers["sunroom"]
    assert entry["command"] == "sunroom"
    command = str(Path(sys.executable).with_name("sunroom"))  # the console script
    async with stdio(*entry["args"], command=command, env=server_env(**entry.get("env", {}))) as c:
        r = await c.call_tool("execute_code", {"code": "import sys\nsys.version_info[0]"})
        assert r.structured_content is not None and r.structured_content["value"] == "3"

    entry = servers["sunroom-http"]
    headers = entry["headers"]
    assert headers == {"Authorization": "Bearer ${SUNROOM_TOKEN}"}
    with http_server() as (url, _):  # the documented command: the default backend (bwrap)
        port = url.rsplit(":", 1)[1].split("/")[0]
        documented = entry["url"].replace(":8766/", f":{port}/")
        assert documented == url
        async with http_client(documented, token=TOKEN) as client:
            r = await client.call_tool("execute_code", {"code": "y = 2\ny ** 10"})
            assert r.structured_content is not None and r.structured_content["value"] == "1024"


# -- settings -------------------------------------------------------------------------------


def test_settings_limits_have_numbers() -> None:
    from sunroom.errors import UsageError
    from sunroom.sandbox.limits import Limits
    from sunroom.service.mcp.server import MAX_TIMEOUT_S, McpSettings

    assert MAX_TIMEOUT_S == 3600
    McpSettings(max_timeout_s=3600)
    bad: list[dict[str, Any]] = [
        {"max_timeout_s": 3601},
        {"max_timeout_s": 0},
        {"limits": Limits(timeout_s=700)},  # over the default max_timeout_s of 600
        {"max_file_bytes": 0},
        {"max_turns": 0},
        {"max_sessions": 0},
        {"session_idle_s": 0},
        {"session_idle_s": float("inf")},
    ]
    for kwargs in bad:
        with pytest.raises(UsageError):
            McpSettings(**kwargs)
    proc = subprocess.run(
        [sys.executable, "-m", "sunroom.cli", "mcp", "--max-timeout", "4000"],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "sunroom: the largest cell timeout must be in (0, 3600] s, got 4000\n"


def test_without_the_sdk_it_says_what_to_install() -> None:
    blocked = "import sys; sys.modules['mcp'] = None; sys.argv = ['sunroom', 'mcp']\n"
    proc = subprocess.run(
        [sys.executable, "-c", blocked + "from sunroom.cli import main; main()"],
        capture_output=True,
        text=True,
        env=server_env(),
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        "sunroom: sunroom mcp needs the MCP SDK: pip install 'sunroom[mcp]'"
    )
