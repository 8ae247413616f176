"""The E2B envd file routes over a real bwrap kernel, driven by E2B's own SDK classes.

A tiny Starlette app of :func:`envd_routes` runs in uvicorn on loopback; ``resolve`` answers
one sandbox id and token. E2B's ``Filesystem`` (sync and async) is built against its URL the
way ``e2b.Sandbox`` builds it, so the wire format is the SDK's, not a copy of it.
"""

from __future__ import annotations

import ast
import asyncio
import gzip
import json
import socket
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from e2b.api.client_async import get_envd_api as get_async_envd_api
from e2b.api.client_sync import get_envd_api
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import (
    AuthenticationException,
    FileNotFoundException,
    InvalidArgumentException,
    SandboxException,
    SandboxNotRunningException,
)
from e2b.sandbox.filesystem.filesystem import FileType
from e2b.sandbox_async.filesystem.filesystem import Filesystem as AsyncFilesystem
from e2b.sandbox_sync.commands.command import Commands
from e2b.sandbox_sync.filesystem.filesystem import Filesystem
from packaging.version import Version
from starlette.applications import Starlette
from starlette.requests import Request

from sunroom import AsyncKernel
from sunroom.service.e2b.envd import EnvdTarget, envd_routes
from sunroom.service.problems import NotFoundError, Unauthorized

pytestmark = pytest.mark.kernel

SID = "sr-test-sandbox"
CLOSED = "sr-closed-sandbox"
TOKEN = "envd-token-0123456789"
CAP = 256 * 1024
ENVD_VERSION = Version("0.6.7")

T = TypeVar("T")


class EnvdServer:
    """uvicorn serving ``envd_routes`` over one bwrap kernel, in a thread of its own."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.workdir = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.kernel: AsyncKernel | None = None
        self._server: uvicorn.Server | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._started.wait(60):
            raise RuntimeError("the envd server did not start")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by __init__
            self._error = exc
            self._started.set()

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        async with AsyncKernel(backend="bwrap") as kernel:
            self.kernel = kernel
            out = await kernel.execute("import os; os.getcwd()")
            assert out.value is not None
            self.workdir = ast.literal_eval(out.value)
            closed = AsyncKernel(backend="bwrap")
            await closed.aclose()

            async def resolve(request: Request) -> EnvdTarget:
                sid = request.headers.get("e2b-sandbox-id", "")
                if sid == CLOSED:  # a sandbox killed while its request was served
                    return EnvdTarget(kernel=closed, workdir=self.workdir, sandbox_id=CLOSED)
                if sid != SID:
                    raise NotFoundError(f"The sandbox {sid} was not found")
                if request.headers.get("x-access-token") != TOKEN:
                    raise Unauthorized("a valid X-Access-Token is required")
                return EnvdTarget(kernel=kernel, workdir=self.workdir, sandbox_id=SID)

            app = Starlette(routes=envd_routes(resolve, max_file_bytes=CAP))
            config = uvicorn.Config(app, log_level="warning", lifespan="off")
            self._server = uvicorn.Server(config)
            self.sock.listen()  # connections wait in its backlog until uvicorn accepts them
            self._started.set()
            await self._server.serve(sockets=[self.sock])

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run *coro* on the server's loop (where its kernel lives)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(30)
        assert not self._thread.is_alive(), "the envd server did not stop"


@pytest.fixture(scope="module")
def server() -> Iterator[EnvdServer]:
    srv = EnvdServer()
    yield srv
    srv.stop()


def config(url: str, *, sid: str = SID, token: str = TOKEN) -> ConnectionConfig:
    headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    return ConnectionConfig(sandbox_url=url, api_key="unused", extra_sandbox_headers=headers)


def files(server: EnvdServer, *, sid: str = SID, token: str = TOKEN) -> Filesystem:
    """E2B's sync ``sandbox.files`` against the test server (as ``Sandbox.__init__`` builds it)."""
    cfg = config(server.url, sid=sid, token=token)
    return Filesystem(server.url, ENVD_VERSION, cfg, get_envd_api(cfg, server.url))


def async_files(server: EnvdServer) -> AsyncFilesystem:
    cfg = config(server.url)
    return AsyncFilesystem(server.url, ENVD_VERSION, cfg, get_async_envd_api(cfg, server.url))


def raw(server: EnvdServer, **headers: str) -> httpx.Client:
    base = {"E2b-Sandbox-Id": SID, "X-Access-Token": TOKEN}
    return httpx.Client(base_url=server.url, headers={**base, **headers}, timeout=30)


def kernel_paths(server: EnvdServer, glob: str = "**/*") -> list[str]:
    assert server.kernel is not None
    return [info.path for info in server.call(server.kernel.files.list(glob))]


# -- the SDK: read, write, list, stat, remove ------------------------------------------------


def test_text_and_bytes_round_trip_through_the_sdk(server: EnvdServer) -> None:
    fs = files(server)
    info = fs.write("rt/hello.txt", "héllo, wörld\n")
    assert (info.name, info.type, info.path) == (
        "hello.txt",
        FileType.FILE,
        f"{server.workdir}/rt/hello.txt",
    )
    assert fs.read("rt/hello.txt") == "héllo, wörld\n"
    assert (
        fs.read(f"{server.workdir}/rt/hello.txt") == "héllo, wörld\n"
    )  # absolute, under the workdir

    blob = bytes(range(256)) * 1000
    fs.write(f"{server.workdir}/rt/blob.bin", blob)
    assert fs.read("rt/blob.bin", format="bytes") == bytearray(blob)
    assert b"".join(fs.read("rt/blob.bin", format="stream")) == blob
    assert server.kernel is not None
    assert server.call(server.kernel.files.read("rt/blob.bin")) == blob  # the kernel's own view


def test_several_files_go_in_one_multipart_upload(server: EnvdServer) -> None:
    fs = files(server)
    infos = fs.write_files(
        [
            {"path": "multi/a.txt", "data": "A"},
            {"path": f"{server.workdir}/multi/deep/b.bin", "data": b"\x00B"},
            {"path": "multi/c.txt", "data": "C" * 70_000},
        ]
    )
    assert [i.path for i in infos] == [
        f"{server.workdir}/multi/a.txt",
        f"{server.workdir}/multi/deep/b.bin",
        f"{server.workdir}/multi/c.txt",
    ]
    assert fs.read("multi/a.txt") == "A"
    assert fs.read("multi/deep/b.bin", format="bytes") == bytearray(b"\x00B")
    assert fs.read("multi/c.txt") == "C" * 70_000


def test_gzip_and_streamed_uploads_are_octet_stream(server: EnvdServer) -> None:
    fs = files(server)
    text = "compressible " * 22_000  # 286 kB raw, over CAP: the cap is on what is written...
    with pytest.raises(SandboxException, match="413"):
        fs.write("gz/big.txt", text, gzip=True)
    assert kernel_paths(server, "gz/*") == []
    small = "compressible " * 10_000  # ...130 kB after gzip: under it
    info = fs.write("gz/small.txt", small, gzip=True)
    assert info.path == f"{server.workdir}/gz/small.txt"
    assert fs.read("gz/small.txt") == small
    fs.write("gz/streamed.bin", iter([b"one ", b"two ", b"three"]))
    assert fs.read("gz/streamed.bin") == "one two three"


def test_async_sdk_writes_reads_and_lists() -> None:
    srv = EnvdServer()
    try:

        async def main() -> None:
            fs = async_files(srv)

            async def chunks() -> AsyncIterator[bytes]:
                for i in range(3):
                    yield f"chunk{i};".encode()

            await fs.write("async/streamed.txt", chunks())
            await fs.write("async/gz.txt", "zipped", gzip=True)
            assert await fs.read("async/streamed.txt") == "chunk0;chunk1;chunk2;"
            assert await fs.read("async/gz.txt") == "zipped"
            names = [e.name for e in await fs.list("async")]
            assert names == ["gz.txt", "streamed.txt"]

        asyncio.run(main())
    finally:
        srv.stop()


def test_list_depth_one_and_two(server: EnvdServer) -> None:
    fs = files(server)
    fs.write_files(
        [
            {"path": "tree/top.txt", "data": "1"},
            {"path": "tree/sub/mid.txt", "data": "22"},
            {"path": "tree/sub/deeper/low.txt", "data": "333"},
            {"path": "tree/we*ird?[x].txt", "data": "4"},
        ]
    )
    one = fs.list("tree")
    assert [(e.name, e.type) for e in one] == [
        ("sub", FileType.DIR),
        ("top.txt", FileType.FILE),
        ("we*ird?[x].txt", FileType.FILE),
    ]
    assert one[1].path == f"{server.workdir}/tree/top.txt"
    assert one[1].size == 1
    assert one[1].modified_time.year >= 2024
    two = fs.list(f"{server.workdir}/tree", depth=2)
    assert [e.path.removeprefix(server.workdir + "/tree/") for e in two] == [
        "sub",
        "sub/deeper",
        "sub/mid.txt",
        "top.txt",
        "we*ird?[x].txt",
    ]
    assert [e.name for e in fs.list("tree/sub/deeper", depth=5)] == ["low.txt"]
    assert "tree" in {e.name for e in fs.list(server.workdir)}  # the workdir itself lists


def test_stat_exists_and_remove(server: EnvdServer) -> None:
    fs = files(server)
    fs.write("st/file.txt", "12345")
    info = fs.get_info("st/file.txt")
    assert (info.name, info.type, info.size) == ("file.txt", FileType.FILE, 5)
    assert info.path == f"{server.workdir}/st/file.txt"
    assert fs.get_info("st").type == FileType.DIR
    root = fs.get_info(server.workdir)
    assert (root.type, root.path) == (FileType.DIR, server.workdir)
    assert fs.exists("st/file.txt")
    assert not fs.exists("st/nothing.txt")

    fs.remove("st/file.txt")
    assert not fs.exists("st/file.txt")
    assert "st/file.txt" not in kernel_paths(server, "st/*")
    fs.remove("st/file.txt")  # nothing there: removed already, as E2B answers
    fs.write("st/tree/x/y.txt", "y")
    fs.remove("st/tree")
    assert kernel_paths(server, "st/**") == []


# -- the SDK's errors --------------------------------------------------------------------------


def test_a_missing_file_is_the_sdks_not_found(server: EnvdServer) -> None:
    fs = files(server)
    with pytest.raises(FileNotFoundException, match="missing.txt does not exist"):
        fs.read("no/such/missing.txt")
    with pytest.raises(FileNotFoundException):
        fs.get_info("no/such/file.txt")
    with pytest.raises(FileNotFoundException):
        fs.list("no/such/dir")


def test_paths_outside_the_workdir_are_invalid_arguments(server: EnvdServer) -> None:
    fs = files(server)
    with pytest.raises(
        InvalidArgumentException, match=r"/home/user, E2B's home, which does not exist"
    ):
        fs.write("/home/user/x.txt", "x")
    with pytest.raises(InvalidArgumentException, match=f"working directory {server.workdir}"):
        fs.read("/etc/passwd")
    with pytest.raises(InvalidArgumentException, match="outside"):
        fs.list("../..")
    with pytest.raises(InvalidArgumentException, match="outside"):
        fs.get_info(f"{server.workdir}/../etc")
    with pytest.raises(InvalidArgumentException, match="is a directory"):
        fs.read(server.workdir)
    fs.write("dirs/f.txt", "f")
    with pytest.raises(InvalidArgumentException, match="not a directory"):
        fs.list("dirs/f.txt")


@pytest.mark.parametrize("sid", ["sr-gone", CLOSED], ids=["unknown", "killed-while-served"])
def test_a_sandbox_that_is_gone_is_not_running(server: EnvdServer, sid: str) -> None:
    fs = files(server, sid=sid)
    with pytest.raises(SandboxNotRunningException, match=f"The sandbox {sid} was not found"):
        fs.read("x.txt")
    with pytest.raises(SandboxNotRunningException, match="was not found"):
        fs.write("x.txt", "x")
    with pytest.raises(SandboxNotRunningException, match="was not found"):
        fs.list(".")
    with pytest.raises(SandboxNotRunningException, match="was not found"):
        fs.exists("x.txt")
    with pytest.raises(SandboxNotRunningException, match="was not found"):
        fs.remove("x.txt")


def test_a_wrong_token_is_refused(server: EnvdServer) -> None:
    fs = files(server, token="wrong")
    with pytest.raises(AuthenticationException, match="X-Access-Token"):
        fs.read("x.txt")
    with pytest.raises(AuthenticationException, match="X-Access-Token"):
        fs.list(".")
    assert "x.txt" not in kernel_paths(server, "*")


def test_an_upload_over_the_cap_is_413_and_leaves_nothing(server: EnvdServer) -> None:
    fs = files(server)
    fs.write("cap/kept.bin", b"old")
    with pytest.raises(SandboxException, match="413.*over the limit of 262144 bytes"):
        fs.write("cap/kept.bin", b"x" * (CAP + 1))  # multipart
    with pytest.raises(SandboxException, match="413"):
        fs.write("cap/new.bin", iter([b"y" * 65536] * 5))  # octet-stream, streamed (chunked)
    assert kernel_paths(server, "cap/*") == ["cap/kept.bin"]  # no temporary file either
    assert fs.read("cap/kept.bin") == "old"
    assert server.kernel is not None
    out = server.call(server.kernel.execute("import os; sorted(os.listdir('cap'))"))
    assert out.value == "['kept.bin']"  # no hidden temporary file left by the refused uploads


def test_unimplemented_rpcs_answer_501_and_never_hang(server: EnvdServer) -> None:
    fs = files(server)
    with pytest.raises(
        SandboxException, match="(?i)unimplemented.*does not cover filesystem.Filesystem/MakeDir"
    ):
        fs.make_dir("newdir")
    with pytest.raises(SandboxException, match="(?i)unimplemented.*Move"):
        fs.rename("a", "b")
    cfg = config(server.url)
    commands = Commands(server.url, cfg, ENVD_VERSION, get_envd_api(cfg, server.url))
    with pytest.raises(SandboxException, match="does not cover process.Process"):
        commands.list()
    with pytest.raises(SandboxException, match="does not cover process.Process/Start"):
        commands.run("echo hi", request_timeout=30)


def test_health_is_204_while_the_sandbox_lives(server: EnvdServer) -> None:
    with raw(server) as client:
        assert client.get("/health").status_code == 204
    with raw(server, **{"E2b-Sandbox-Id": "sr-gone"}) as client:
        r = client.get("/health")
        assert (r.status_code, r.json()) == (
            502,
            {"code": 502, "message": "The sandbox sr-gone was not found"},
        )


# -- the error shapes on the wire ----------------------------------------------------------------


OCTET = {"Content-Type": "application/octet-stream"}
GZIP = {**OCTET, "Content-Encoding": "gzip"}
CUT = b'--b\r\nContent-Disposition: form-data; name="file"; filename="cut.txt"\r\n\r\nabc'

HTTP_ERRORS: list[tuple[str, dict[str, Any], int, str]] = [
    (
        "missing",
        {"method": "GET", "params": {"path": "missing.txt"}},
        404,
        "missing.txt does not exist",
    ),
    (
        "e2b-home",
        {"method": "GET", "params": {"path": "/home/user/a"}},
        400,
        "/home/user, E2B's home",
    ),
    ("directory", {"method": "GET", "params": {"path": "."}}, 400, "is a directory"),
    (
        "content-type",
        {"params": {"path": "a.txt"}, "content": b"x", "headers": {"Content-Type": "text/plain"}},
        400,
        "multipart/form-data or application/octet-stream",
    ),
    ("no-path", {"content": b"x", "headers": OCTET}, 400, "needs the path parameter"),
    (
        "not-gzip",
        {"params": {"path": "gz.txt"}, "content": b"not gzip", "headers": GZIP},
        400,
        "not valid gzip",
    ),
    (
        "cut-gzip",
        {
            "params": {"path": "gz.txt"},
            "content": gzip.compress(b"x" * 1000)[:-12],
            "headers": GZIP,
        },
        400,
        "ended before its end",
    ),
    (
        "metadata",
        {
            "params": {"path": "meta.txt"},
            "content": b"x",
            "headers": {**OCTET, "X-Metadata-Owner": "me"},
        },
        501,
        "file metadata",
    ),
    (
        "over-cap",
        {"params": {"path": "big.bin"}, "content": b"z" * (CAP + 1), "headers": OCTET},
        413,
        f"over the limit of {CAP} bytes",
    ),
    (
        "same-path",
        {"files": [("file", ("dup.txt", b"1")), ("file", ("dup.txt", b"2"))]},
        400,
        "two parts of one upload",
    ),
    (
        "cut-multipart",
        {"content": CUT, "headers": {"Content-Type": "multipart/form-data; boundary=b"}},
        400,
        "ended before its closing boundary",
    ),
    (
        "no-boundary",
        {"content": b"x", "headers": {"Content-Type": "multipart/form-data"}},
        400,
        "no boundary",
    ),
]


@pytest.mark.parametrize(
    ("case", "request_", "status", "message"), HTTP_ERRORS, ids=[c[0] for c in HTTP_ERRORS]
)
def test_http_error_shapes(
    server: EnvdServer, case: str, request_: dict[str, Any], status: int, message: str
) -> None:
    options = dict(request_)
    method = options.pop("method", "POST")
    with raw(server) as client:
        r = client.request(method, "/files", **options)
    assert (r.status_code, set(r.json()), r.json()["code"]) == (status, {"code", "message"}, status)
    assert message in r.json()["message"]
    assert not {"big.bin", "cut.txt", "gz.txt", "meta.txt"} & set(kernel_paths(server, "*"))


def test_a_bad_token_is_401_json(server: EnvdServer) -> None:
    with raw(server, **{"X-Access-Token": "bad"}) as client:
        r = client.get("/files", params={"path": "x"})
    assert (r.status_code, r.json()) == (
        401,
        {"code": 401, "message": "a valid X-Access-Token is required"},
    )


def test_connect_error_shapes(server: EnvdServer) -> None:
    json_headers = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    with raw(server, **json_headers) as client:
        r = client.post("/filesystem.Filesystem/Stat", content=json.dumps({"path": "nope"}))
        assert (r.status_code, r.json()["code"]) == (404, "not_found")
        assert set(r.json()) == {"code", "message"}
        r = client.post("/filesystem.Filesystem/Stat", content=json.dumps({"path": "/etc"}))
        assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
        r = client.post(
            "/filesystem.Filesystem/ListDir", content=json.dumps({"path": ".", "depth": -1})
        )
        assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
        assert "depth" in r.json()["message"]
        r = client.post("/filesystem.Filesystem/ListDir", content=b"{not json")
        assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
        r = client.post("/filesystem.Filesystem/MakeDir", content=json.dumps({"path": "d"}))
        assert (r.status_code, r.json()["code"]) == (501, "unimplemented")
        assert r.json()["message"].startswith(
            "sunroom's E2B API does not cover filesystem.Filesystem/MakeDir"
        )
        r = client.post("/process.Process/List", content=b"{}")
        assert (r.status_code, r.json()["code"]) == (501, "unimplemented")
        r = client.post(
            "/filesystem.Filesystem/Remove", content=json.dumps({"path": server.workdir})
        )
        assert (r.status_code, r.json()["code"]) == (400, "invalid_argument")
        r = client.post("/filesystem.Filesystem/Stat", content=b"{" + b" " * 70_000 + b"}")
        assert (r.status_code, r.json()["code"]) == (429, "resource_exhausted")
        r = client.post(
            "/filesystem.Filesystem/Stat",
            content=b"\x0a\x01x",
            headers={"Content-Type": "application/proto"},
        )
        assert (r.status_code, r.json()["code"]) == (415, "unimplemented")
        r = client.post("/filesystem.Filesystem/Stat", content=json.dumps({"path": "."}))
        assert r.status_code == 200
        assert r.json() == {
            "entry": {
                "name": server.workdir.rsplit("/", 1)[-1],
                "type": "FILE_TYPE_DIRECTORY",
                "path": server.workdir,
            }
        }
    with raw(server, **json_headers, **{"E2b-Sandbox-Id": "sr-gone"}) as client:
        r = client.post("/filesystem.Filesystem/Stat", content=b"{}")
        assert (r.status_code, r.json()) == (
            503,
            {"code": "unavailable", "message": "The sandbox sr-gone was not found"},
        )
    with raw(server, **json_headers, **{"X-Access-Token": "bad"}) as client:
        r = client.post("/filesystem.Filesystem/Stat", content=b"{}")
        assert (r.status_code, r.json()["code"]) == (401, "unauthenticated")


def test_entry_info_is_protobuf_json(server: EnvdServer) -> None:
    from e2b.envd.filesystem import filesystem_pb

    files(server).write("pb/one.txt", "abc")
    with raw(server, **{"Content-Type": "application/json"}) as client:
        r = client.post("/filesystem.Filesystem/ListDir", content=json.dumps({"path": "pb"}))
    assert r.status_code == 200
    entry = r.json()["entries"][0]
    assert set(entry) == {"name", "type", "path", "size", "modifiedTime"}
    assert entry["size"] == "3"
    assert entry["modifiedTime"].endswith("Z")
    parsed = filesystem_pb.ListDirResponse.from_json(r.text)  # the SDK's own parser, strict
    assert parsed.entries[0].type == filesystem_pb.FileType.FILE
    assert parsed.entries[0].size == 3


def test_files_through_sunroom_serve_with_the_sdks_sandbox(make_server: Any) -> None:
    """The routes as ``sunroom serve`` mounts them (its E2B facade, its sendfile downloads)."""
    from e2b import Sandbox

    from tests.service.conftest import TOKEN as SERVER_TOKEN

    srv = make_server(backend="bwrap", max_file_bytes=8 << 20)
    sandbox = Sandbox.create(api_key=SERVER_TOKEN, api_url=srv.url, sandbox_url=srv.url)
    try:
        blob = bytes(range(256)) * 12_000  # 3 MB: several chunks of the kernel's channel
        info = sandbox.files.write("served/blob.bin", blob)
        assert sandbox.files.read(info.path, format="bytes") == bytearray(blob)
        assert sandbox.files.read("served/blob.bin", format="bytes", gzip=True) == bytearray(blob)
        assert [e.name for e in sandbox.files.list("served")] == ["blob.bin"]
        assert sandbox.is_running()
        sandbox.kill()
        with pytest.raises(SandboxNotRunningException, match="was not found"):
            sandbox.files.read("served/blob.bin")
    finally:
        sandbox.kill()
