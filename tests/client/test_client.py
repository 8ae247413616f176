"""sunroom.client against a real ``sunroom serve`` on 127.0.0.1 with real kernels."""

from __future__ import annotations

import inspect
import json
import socket
import subprocess
import sys
from collections.abc import Callable

import pytest

from sunroom.client import AsyncClient, Client
from sunroom.errors import FileError, ServiceError, SunroomError, UsageError
from sunroom.providers import ScriptedModel
from sunroom.service.problems import ConflictError, NotFoundError
from sunroom.service.schemas import CreateSession
from tests.client.cutting_proxy import CuttingProxy
from tests.service.conftest import TOKEN, Server, code
from tests.service.conftest import make_server as make_server  # the fixture, re-exported


def test_the_twins_have_the_same_explicit_signatures() -> None:
    core = {n: getattr(AsyncClient, n) for n in dir(AsyncClient) if not n.startswith("_")}
    twin = {n: getattr(Client, n) for n in dir(Client) if not n.startswith("_")}
    assert set(core) - {"aclose"} == set(twin) - {"close"}
    for name in set(core) - {"aclose"}:
        assert list(inspect.signature(core[name]).parameters.values()) == list(
            inspect.signature(twin[name]).parameters.values()
        ), name
    assert inspect.signature(AsyncClient) == inspect.signature(Client)


def test_a_raw_kernel_executes_forks_and_moves_files(make_server: Callable[..., Server]) -> None:
    server = make_server()
    with Client(server.url, token=TOKEN) as client:
        kid = client.create_kernel(inputs={"base": 40})
        assert [k.kernel_id for k in client.kernels()] == [kid]
        assert client.kernel(kid).backend == "subprocess"
        out = client.execute(kid, "x = base + 1\nprint('hi')\nx + 1")
        assert (out.status, out.value, out.stdout) == ("ok", "42", "hi\n")
        failed = client.execute(kid, "1 / 0")
        assert failed.status == "error" and failed.error is not None
        assert failed.error.type == "ZeroDivisionError"
        assert client.write_file(kid, "data/a.bin", b"\x00\x01") == 2
        assert client.read_file(kid, "data/a.bin") == b"\x00\x01"
        assert [f.path for f in client.list_files(kid, "data/*")] == ["data/a.bin"]
        client.delete_file(kid, "data/a.bin")
        with pytest.raises(FileError) as missing:
            client.read_file(kid, "data/a.bin")
        assert missing.value.reason == "not_found"
        (copy,) = client.fork(kid)
        assert client.execute(copy, "x").value == "41"
        client.close_kernel(kid)
        with pytest.raises(NotFoundError, match="no kernel"):
            client.execute(kid, "x")
        assert [k.kernel_id for k in client.kernels()] == [copy]


def test_errors_are_the_error_tree(make_server: Callable[..., Server]) -> None:
    server = make_server()
    with Client(server.url, token="not-the-token") as wrong:
        with pytest.raises(UsageError, match="Bearer"):
            wrong.kernels()
        assert wrong.health().ok  # /healthz needs no token
    with Client(server.url, token=TOKEN) as client:
        with pytest.raises(UsageError, match="n: "):
            client.fork("nope", 0)  # 422 before the kernel is looked up
        with pytest.raises(NotFoundError):
            client.session("nope")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", token=TOKEN) as gone:
        with pytest.raises(ServiceError, match="could not be reached") as unreachable:
            gone.kernels()
        assert unreachable.value.status is None
    assert issubclass(ServiceError, SunroomError)


async def test_a_session_streams_resumes_and_ends(make_server: Callable[..., Server]) -> None:
    model = ScriptedModel([code("print(6 * 7)"), "forty-two"])
    server = make_server(model)
    async with AsyncClient(server.url, token=TOKEN) as client:
        sid = await client.create_session("compute", options=CreateSession(max_turns=5))
        events = [e async for e in client.events(sid)]
        kinds = [e.type for e in events]
        assert "MessageReceived" in kinds and kinds[-1] != "end"
        seqs = [e.seq for e in events]
        assert seqs == sorted(set(seqs))
        result = await client.result(sid, timeout_s=30)
        assert result.status == "finished", result
        middle = seqs[len(seqs) // 2]
        again = [e.seq async for e in client.events(sid, after=middle)]
        assert again == [s for s in seqs if s > middle]  # resumed: nothing lost, nothing twice
        assert (await client.session(sid)).status == "finished"
        assert await client.approvals(sid) == []
        with pytest.raises(NotFoundError, match="no approval request"):
            await client.approve(sid, "call_nope", allow=True)
        await client.send(sid, "again")
        assert sid in [r.session_id for r in await client.sessions()]
        await client.delete_session(sid)
        document = await client.openapi()
        assert document["openapi"] == "3.1.0"


async def test_a_cut_event_stream_is_resumed_from_the_last_event(
    make_server: Callable[..., Server],
) -> None:
    """The stream breaks mid-way (a proxy cuts it): the client reconnects with Last-Event-ID
    and yields every event exactly once."""
    server = make_server(ScriptedModel([code("print(6 * 7)"), "forty-two"]))
    async with AsyncClient(server.url, token=TOKEN) as direct:
        sid = await direct.create_session("compute")
        assert (await direct.result(sid, timeout_s=30)).status == "finished"
        whole = [e.seq async for e in direct.events(sid)]
    # the first stream is cut a little way into its body, mid-event
    proxy = CuttingProxy(server.port, lambda n: 700 if n == 0 else None)
    url = await proxy.start()
    try:
        async with AsyncClient(url, token=TOKEN) as client:
            got = [e.seq async for e in client.events(sid)]
    finally:
        await proxy.aclose()
    assert got == whole
    streams = [h for h in proxy.heads if b"/events" in h]
    assert len(streams) == 2, streams
    resumed = [
        line for line in streams[1].split(b"\r\n") if line.lower().startswith(b"last-event-id")
    ]
    assert resumed and resumed[0].split(b":")[1].strip() != b"0"
    assert int(resumed[0].split(b":")[1]) in whole[:-1]  # cut mid-way: events came after


async def test_a_stream_that_keeps_breaking_without_an_event_raises(
    make_server: Callable[..., Server],
) -> None:
    server = make_server(ScriptedModel([code("print(1)"), "one"]))
    async with AsyncClient(server.url, token=TOKEN) as direct:
        sid = await direct.create_session("go")
        assert (await direct.result(sid, timeout_s=30)).status == "finished"
    proxy = CuttingProxy(server.port, lambda n: 0)  # every connection ends before its answer
    url = await proxy.start()
    try:
        async with AsyncClient(url, token=TOKEN) as client:
            with pytest.raises(ServiceError, match="3 times in a row"):
                [e async for e in client.events(sid)]
    finally:
        await proxy.aclose()


@pytest.mark.kernel  # a fresh interpreter: a process
def test_the_client_loads_no_web_framework_and_no_provider_sdk() -> None:
    """The client works where only ``sunroom[client]`` is installed: importing it loads none
    of the service's or the providers' packages."""
    code = (
        "import json, sys\n"
        "from sunroom.client import AsyncClient, Client\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(proc.stdout))
    assert "httpx" in loaded
    heavy = {"starlette", "uvicorn", "httptools", "anthropic", "openai", "docker", "mcp"}
    assert not loaded & heavy, sorted(loaded & heavy)


RAN: list[str] = []


def delete_repo(name: str) -> str:
    """Delete a repository (a stand-in with a side effect)."""
    RAN.append(name)
    return f"deleted {name}"


def test_an_approval_is_seen_in_the_events_and_answered(
    make_server: Callable[..., Server],
) -> None:
    RAN.clear()
    model = ScriptedModel([code("print(delete_repo(name='x'))"), "done"])
    server = make_server(model, functions=[delete_repo])
    options = CreateSession(approvals={"delete_*": "ask"}, approval_timeout_s=60)
    with Client(server.url, token=TOKEN) as client:
        sid = client.create_session("go", options=options)
        stream = client.events(sid)
        asked = next(e for e in stream if e.type == "ApprovalRequested")
        (waiting,) = client.approvals(sid)
        assert waiting.call_id == asked.data["call_id"] and waiting.name == "delete_repo"
        assert RAN == []
        client.approve(sid, waiting.call_id, allow=True, reason="fine")
        with pytest.raises(ConflictError, match="already answered"):
            client.approve(sid, waiting.call_id, allow=False)
        rest = [e.type for e in stream]  # the same stream goes on to the run's end
        assert "ApprovalAnswered" in rest and "SessionEnded" in rest
        assert client.result(sid, timeout_s=30).status == "finished"
        assert RAN == ["x"]
