"""The file routes against a real server on loopback: uploads, downloads, listings, limits."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import httpx
import pytest

from sunroom.providers import ScriptedModel
from sunroom.sandbox import fdtake
from tests.service.conftest import TOKEN, Server


def _kernel(server: Server) -> str:
    r = server.client.post("/kernels", json={})
    assert r.status_code == 201, r.text
    kid: str = r.json()["kernel_id"]
    return kid


def _listing(server: Server, base: str, glob: str = "**/*") -> list[str]:
    r = server.client.get(f"{base}/files", params={"glob": glob})
    assert r.status_code == 200, r.text
    return [row["path"] for row in r.json()["files"]]


def test_put_get_list_delete_on_a_raw_kernel(make_server: Callable[..., Server]) -> None:
    server = make_server()
    base = f"/kernels/{_kernel(server)}"
    data = bytes(range(256)) * 10_000  # 2.5 MB: several frames to the kernel
    r = server.client.put(f"{base}/files/in/data.bin", content=data)
    assert r.status_code == 200, r.text
    assert r.json() == {"path": "in/data.bin", "size": len(data)}
    code = "import os\nos.path.getsize('in/data.bin')"
    out = server.client.post(f"{base}/execute", json={"code": code}).json()
    assert out["value"] == str(len(data))
    with server.client.stream("GET", f"{base}/files/in/data.bin") as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"] == "application/octet-stream"
        assert resp.headers["content-length"] == str(len(data))  # not chunked
        assert "transfer-encoding" not in resp.headers
        assert b"".join(resp.iter_bytes()) == data
    # a chunked upload, in pieces that do not line up with the kernel's chunks
    pieces = [data[at : at + 300_001] for at in range(0, len(data), 300_001)]
    r = server.client.put(f"{base}/files/in/again.bin", content=iter(pieces))
    assert r.status_code == 200 and r.json()["size"] == len(data)
    assert server.client.get(f"{base}/files/in/again.bin").content == data
    assert server.client.delete(f"{base}/files/in/again.bin").status_code == 200
    rows = server.client.get(f"{base}/files").json()["files"]
    assert [(row["path"], row["is_dir"], row["size"]) for row in rows][1] == (
        "in/data.bin",
        False,
        len(data),
    )
    assert _listing(server, base, "*.bin") == []
    assert _listing(server, base, "**/*.bin") == ["in/data.bin"]
    assert server.client.delete(f"{base}/files/in").json() == {"path": "in", "deleted": True}
    assert _listing(server, base) == []
    r = server.client.get(f"{base}/files/in/data.bin")
    assert r.status_code == 404 and r.json()["error"]["type"] == "FileError"
    assert server.client.get("/kernels/nope/files").status_code == 404
    assert server.client.put("/kernels/nope/files/x", content=b"x").status_code == 404


def test_an_empty_file_and_a_directory(make_server: Callable[..., Server]) -> None:
    server = make_server()
    base = f"/kernels/{_kernel(server)}"
    assert server.client.put(f"{base}/files/d/empty", content=b"").json()["size"] == 0
    assert server.client.get(f"{base}/files/d/empty").content == b""
    r = server.client.get(f"{base}/files/d")
    assert r.status_code == 409 and "directory" in r.json()["error"]["message"]


def test_escapes_are_refused(make_server: Callable[..., Server]) -> None:
    server = make_server()
    base = f"/kernels/{_kernel(server)}"
    plant = "import os\nos.symlink('/etc/passwd', 'pw')\nos.symlink('/etc', 'etc')"
    assert server.client.post(f"{base}/execute", json={"code": plant}).json()["status"] == "ok"
    for path in ("pw", "etc/passwd", "%2e%2e/x", "a/%2e%2e/%2e%2e/x", "%00"):
        r = server.client.get(f"{base}/files/{path}")
        assert r.status_code == 422, (path, r.text)
        assert r.json()["error"]["type"] == "FileError"
        assert "/etc" not in r.json()["error"]["message"]
    r = server.client.put(f"{base}/files/etc/planted", content=b"x")
    assert r.status_code == 422 and "symbolic link" in r.json()["error"]["message"]
    r = server.client.get(f"{base}/files", params={"glob": "../*"})
    assert r.status_code == 422
    out = server.client.post(f"{base}/execute", json={"code": "1 + 1"}).json()
    assert out["value"] == "2"  # the kernel keeps working


def _raw(server: Server, head: str, body: Iterable[bytes] = ()) -> bytes:
    """Send a raw request (head, then body pieces), then read the answer until close."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    try:
        sock.sendall(head.encode())
        try:
            for piece in body:
                sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed early: read what it said
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
                if b"\r\n\r\n" in data and b"}" in data:
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return data
    finally:
        sock.close()


def test_an_upload_over_the_limit_is_413_and_writes_nothing(
    make_server: Callable[..., Server],
) -> None:
    limit = 1024 * 1024
    server = make_server(max_file_bytes=limit)
    kid = _kernel(server)
    base = f"/kernels/{kid}"
    head = (
        f"PUT {base}/files/huge.bin HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\n"
    )
    # a declared 10 GB: refused before a byte of the body is sent
    answer = _raw(server, head + f"Content-Length: {10 * 1024**3}\r\n\r\n")
    assert b" 413 " in answer.split(b"\r\n", 1)[0] and b"BodyTooLarge" in answer
    # a chunked body that crosses the limit mid-way: the server stops reading and answers 413
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        piece = b"x" * 65536
        while sent < 50 * limit:
            sent += len(piece)
            yield b"%x\r\n%s\r\n" % (len(piece), piece)

    answer = _raw(server, head + "Transfer-Encoding: chunked\r\n\r\n", chunks())
    assert b" 413 " in answer.split(b"\r\n", 1)[0] and b"BodyTooLarge" in answer
    assert sent < 50 * limit  # it did not take the whole body
    assert _listing(server, base) == []
    code = "import os\nsorted(os.listdir('.'))"
    out = server.client.post(f"{base}/execute", json={"code": code}).json()
    assert out["value"] == "[]"  # no temporary file either
    # under the limit, the JSON body limit does not apply to a file
    big = b"y" * (limit - 1)
    assert server.client.put(f"{base}/files/ok.bin", content=big).json()["size"] == limit - 1


def test_the_files_of_a_session_kernel(make_server: Callable[..., Server]) -> None:
    server = make_server(ScriptedModel(["hi"] * 4))
    sid = server.client.post("/sessions", json={}).json()["session_id"]
    base = f"/sessions/{sid}"
    assert server.client.put(f"{base}/files/notes.txt", content=b"hello").status_code == 200
    assert server.client.get(f"{base}/files/notes.txt").content == b"hello"
    assert _listing(server, base) == ["notes.txt"]
    assert server.client.delete(f"{base}/files/notes.txt").status_code == 200
    assert server.client.get("/sessions/nope/files").status_code == 404
    server.client.delete(f"/sessions/{sid}")
    r = server.client.get(f"{base}/files")
    assert r.status_code == 409


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/kernels/x/files"), ("PUT", "/kernels/x/files/a"), ("GET", "/sessions/x/files/a")],
)
def test_the_file_routes_need_the_token(
    make_server: Callable[..., Server], method: str, path: str
) -> None:
    server = make_server()
    assert server.anon.request(method, path, content=b"x").status_code == 401


def test_file_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from sunroom.service import ServiceConfig

    monkeypatch.setenv("SUNROOM_MAX_FILE_BYTES", "12345")
    monkeypatch.setenv("SUNROOM_READ_TIMEOUT_S", "60")
    config = ServiceConfig.from_env()
    assert config.max_file_bytes == 12345 and config.read_timeout_s == 60


CHANGE_WHEN_TOLD = """
import os, threading, time
def change():
    while not os.path.exists({go!r}):
        time.sleep(0.01)
    {action}
    open({done!r}, "w").close()
threading.Thread(target=change, daemon=True).start()
"""


class Cue:
    """Files on the host through which a test tells the kernel when to act, and hears back.

    The servers here run subprocess kernels, which see the host's files: a cell started with
    :meth:`code` waits in a thread until the test calls :meth:`act`, does *action*, and says
    so. A download can then be changed at an exact point, however loaded the machine is.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sunroom-cue-"))
        self.dir.chmod(0o777)  # the kernel runs as a uid of its own
        self.go = self.dir / "go"
        self.done = self.dir / "done"

    def code(self, action: str) -> str:
        """A cell that does *action* once told to."""
        return CHANGE_WHEN_TOLD.format(go=str(self.go), done=str(self.done), action=action)

    def act(self) -> None:
        """Tell the kernel to act, and wait until it has."""
        self.go.touch()
        deadline = time.monotonic() + 60
        while not self.done.exists():
            assert time.monotonic() < deadline, "the kernel never acted"
            time.sleep(0.01)
        shutil.rmtree(self.dir)


def _slow_get(server: Server, url: str, cue: Cue | None = None) -> tuple[dict[str, str], bytes]:
    """GET *url*: take 64 KiB, let the kernel act (*cue*), then take the rest."""
    with server.client.stream("GET", url) as resp:
        assert resp.status_code == 200
        chunks = resp.iter_raw(65536)
        got = next(chunks)
        if cue is not None:
            cue.act()
        return dict(resp.headers), got + b"".join(chunks)


def _changed_while_sent(
    server: Server, base: str, name: str, action: str
) -> tuple[dict[str, str], bytes]:
    """Download *name* while the kernel does *action* after the first 64 KiB went out."""
    cue = Cue()
    answer = server.client.post(f"{base}/execute", json={"code": cue.code(action)}).json()
    assert answer["status"] == "ok"
    return _slow_get(server, f"{base}/files/{name}", cue)


def _shrinks_while_sent(server: Server, base: str, name: str) -> None:
    """*name* cut to 1000 bytes mid-download ends the connection: the body is short, never
    padded; a HEAD request then gets the new length and no body."""
    with pytest.raises(httpx.RemoteProtocolError):
        _changed_while_sent(server, base, name, f"os.truncate({name!r}, 1000)")
    r = server.client.head(f"{base}/files/{name}")
    assert r.status_code == 200 and r.headers["content-length"] == "1000" and r.content == b""


@pytest.mark.parametrize("through", ["sendfile", "channel"])
def test_a_download_is_the_file_as_opened(
    make_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch, through: str
) -> None:
    if through == "channel":  # as where the kernel's descriptors cannot be taken
        monkeypatch.setattr(fdtake, "available", lambda: False)
    elif not fdtake.available():
        pytest.skip("pidfd_getfd is unavailable")
    server = make_server()
    base = f"/kernels/{_kernel(server)}"
    data = os.urandom(32 * 1024 * 1024)  # more than loopback buffers hold
    assert server.client.put(f"{base}/files/f.bin", content=data).status_code == 200
    # replaced by a link out of the workdir during the download: the download is unchanged
    swap = "os.symlink('/etc/passwd', 'l'); os.replace('l', 'f.bin')"
    headers, got = _changed_while_sent(server, base, "f.bin", swap)
    assert headers["content-length"] == str(len(data)) and got == data
    r = server.client.get(f"{base}/files/f.bin")
    assert r.status_code == 422 and "symbolic link" in r.json()["error"]["message"]
    # a file that grows meanwhile is cut at its Content-Length
    assert server.client.put(f"{base}/files/g.bin", content=data).status_code == 200
    grow = "open('g.bin', 'ab').write(b'more' * 1000)"
    headers, got = _changed_while_sent(server, base, "g.bin", grow)
    assert headers["content-length"] == str(len(data)) and got == data
    _shrinks_while_sent(server, base, "g.bin")
    # a client that goes away mid-way frees the kernel too
    with server.client.stream("GET", f"{base}/files/f2.bin") as resp:
        assert resp.status_code == 404
    assert server.client.put(f"{base}/files/f2.bin", content=data).status_code == 200
    with server.client.stream("GET", f"{base}/files/f2.bin") as resp:
        next(resp.iter_raw(65536))
    out = server.client.post(f"{base}/execute", json={"code": "1 + 1"}).json()
    assert out["value"] == "2"  # the kernel was released each time


def test_a_download_from_a_server_on_uvloop(make_server: Callable[..., Server]) -> None:
    """uvloop has no ``loop.sendfile``: the taken file is read and written in pieces instead."""
    if not fdtake.available():
        pytest.skip("pidfd_getfd is unavailable")
    server = make_server(event_loop="uvloop")
    base = f"/kernels/{_kernel(server)}"
    data = os.urandom(32 * 1024 * 1024 + 3)  # more than loopback buffers hold; the last piece short
    assert server.client.put(f"{base}/files/f.bin", content=data).status_code == 200
    headers, got = _slow_get(server, f"{base}/files/f.bin")
    assert headers["content-length"] == str(len(data)) and got == data
    _shrinks_while_sent(server, base, "f.bin")
    r = server.client.get(f"{base}/files/f.bin")
    assert r.status_code == 200 and r.content == data[:1000]


def test_a_glob_with_a_character_class_is_a_400(make_server: Callable[..., Server]) -> None:
    """Issue 26, item 7: ``glob=[`` answered 200 with no files; the listing has no classes."""
    server = make_server()
    base = f"/kernels/{_kernel(server)}"
    assert server.client.put(f"{base}/files/a1.txt", content=b"x").status_code == 200
    for glob in ("[", "*.[ch]", "a[0-9].txt", "]"):
        r = server.client.get(f"{base}/files", params={"glob": glob})
        assert r.status_code == 400, (glob, r.text)
        error = r.json()["error"]
        assert error["type"] == "InvalidGlob"
        assert "character classes" in error["message"]
    assert _listing(server, base, "a?.txt") == ["a1.txt"]
