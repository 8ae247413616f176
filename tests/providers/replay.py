"""A real HTTP/1.1 server on 127.0.0.1 that replays recorded provider exchanges.

It speaks plain HTTP over a socket (stdlib ``http.server`` in a thread), so the official SDKs
talk to it through their normal transports; nothing is patched. SSE bodies are sent with
chunked transfer encoding, one chunk per event block (split at blank lines). Modes:

* ``normal``: the recorded status, headers and body.
* ``hang``: read the request, then send nothing until the server is closed.
* ``cut``: send the headers and the first ``cut_after`` SSE blocks, then drop the connection
  without the terminating chunk (the client sees a truncated body).

Self-contained (stdlib only) so ``benchmarks/providers.py`` can load it by path.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"

# Transport headers the server computes itself.
_SKIP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


@dataclass
class Reply:
    """One scripted reply."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    mode: str = "normal"  # normal | hang | cut
    cut_after: int = 1

    @property
    def is_sse(self) -> bool:
        return self.headers.get("content-type", "").startswith("text/event-stream")


@dataclass
class Recorded:
    """A request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def load(name: str) -> dict[str, Any]:
    """Load ``<provider>/<name>.json`` from the test data."""
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


def reply_from(name: str, **overrides: Any) -> Reply:
    """Build a :class:`Reply` from a recorded exchange file."""
    exchange = load(name)
    response = exchange["response"]
    reply = Reply(
        status=response["status"],
        headers=dict(response["headers"]),
        body=response["body"],
    )
    for key, value in overrides.items():
        setattr(reply, key, value)
    return reply


def json_reply(status: int, body: Any, headers: dict[str, str] | None = None) -> Reply:
    """A JSON reply written by hand (for error shapes with no recording)."""
    return Reply(
        status=status,
        headers={"content-type": "application/json", **(headers or {})},
        body=json.dumps(body),
    )


def sse_blocks(body: str) -> list[str]:
    """Split an SSE body into event blocks, each keeping its terminating blank line."""
    sep = "\r\n\r\n" if "\r\n\r\n" in body else "\n\n"
    parts = body.split(sep)
    blocks = [part + sep for part in parts[:-1]]
    if parts[-1]:
        blocks.append(parts[-1])
    return blocks


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def setup(self) -> None:
        super().setup()
        # No Nagle delay on replies (it would add ~40 ms per request on loopback).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        headers = {k.lower(): v for k, v in self.headers.items()}
        recorded = Recorded(self.command, self.path, headers, body)
        reply = self.server.owner._next(self.command, path, recorded)
        try:
            self._send(reply)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True

    def _send(self, reply: Reply) -> None:
        if reply.mode == "hang":
            self.server.owner._release.wait(30)
            self.close_connection = True
            return
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            if name.lower() not in _SKIP_HEADERS:
                self.send_header(name, value)
        data = reply.body.encode("utf-8")
        if not reply.is_sse:
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            return
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        blocks = sse_blocks(reply.body)
        if reply.mode == "cut":
            blocks = blocks[: reply.cut_after]
        for block in blocks:
            chunk = block.encode("utf-8")
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
        if reply.mode == "cut":
            # Drop the connection mid-body: no terminating zero-length chunk.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the default 5 drops connects when many clients start at once
    owner: ReplayServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up on a cut or hanging reply is expected here


class ReplayServer:
    """Serve scripted replies on 127.0.0.1; use as a context manager.

    Replies are queued per ``(method, path)`` (path without query) and served in order; a
    reply added with ``times=None`` is served forever. A request with no reply gets a 599
    and is remembered in ``unexpected``.
    """

    def __init__(self) -> None:
        self._queues: dict[tuple[str, str], deque[tuple[Reply, int | None]]] = {}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.requests: list[Recorded] = []
        self.unexpected: list[Recorded] = []
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, path: str, reply: Reply, *, method: str = "POST", times: int | None = 1) -> None:
        """Queue ``reply`` for ``method path`` (``times=None``: forever)."""
        with self._lock:
            self._queues.setdefault((method, path), deque()).append((reply, times))

    def replace(self, path: str, reply: Reply, *, method: str = "POST") -> None:
        """Serve ``reply`` forever for ``method path``, dropping what was queued."""
        with self._lock:
            self._queues[(method, path)] = deque([(reply, None)])

    def _next(self, method: str, path: str, recorded: Recorded) -> Reply:
        with self._lock:
            self.requests.append(recorded)
            queue = self._queues.get((method, path))
            if not queue:
                self.unexpected.append(recorded)
                return json_reply(599, {"error": f"no scripted reply for {method} {path}"})
            reply, times = queue[0]
            if times is not None:
                if times <= 1:
                    queue.popleft()
                else:
                    queue[0] = (reply, times - 1)
            return reply

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
