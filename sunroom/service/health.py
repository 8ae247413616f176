"""``GET /healthz`` off the event loop: :class:`HealthGate`, the server's acceptor thread.

The gate owns the listening socket. It accepts every connection in a thread of its own and
looks at (peeks, without consuming) the first request: a plain ``GET /healthz`` (no body, an
allowed ``Host``) is answered right there, from the thread; any other connection is handed,
with its bytes unread, to the event loop, where uvicorn serves it as if it had accepted it.

So a health check never waits for the loop: not for requests queued in front of it, not for
a callback that holds the loop (an inline host function, a kernel start). The thread needs
only the GIL, which a busy loop thread gives up every ``sys.getswitchinterval()`` (5 ms).

A connection whose requests are all health checks stays with the gate (keep-alive, closed
after :data:`KEEPALIVE_S` idle); its first other request hands it to the loop. A connection
that sends nothing within :data:`HOLD_S` is handed over as well (the loop's read deadline and
connection caps then apply), and so is every new one while the gate holds :data:`MAX_HELD`.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Final, final

__all__ = ["HOLD_S", "KEEPALIVE_S", "MAX_HELD", "HealthGate", "parse_health_request"]

log = logging.getLogger("sunroom.service")

HOLD_S: Final = 0.1
"""A new connection that sends nothing within this is handed to the loop."""

KEEPALIVE_S: Final = 5.0
"""A connection held by the gate is closed after this long without a request (uvicorn's)."""

MAX_HELD: Final = 64
"""Connections the gate holds at most; a new one beyond is handed to the loop at once."""

_PREFIX: Final = b"GET /healthz"


def parse_health_request(
    data: bytes, *, host_allowed: Callable[[str], bool], max_head: int
) -> tuple[int, bool] | None:
    """``(head length, close after answering)`` if *data* starts with a whole health check.

    A health check is ``GET /healthz`` (a query is ignored), HTTP/1.1 with an allowed
    ``Host`` or HTTP/1.0, with no body and a head of at most *max_head* bytes. Anything
    else, a partial head included, is None: the event loop serves it (and refuses what it
    must, e.g. a foreign ``Host``).
    """
    if not data.startswith(_PREFIX) or data[len(_PREFIX) : len(_PREFIX) + 1] not in (b" ", b"?"):
        return None
    end = data.find(b"\r\n\r\n", 0, max_head + 4)
    if end < 0:
        return None
    lines = data[:end].split(b"\r\n")
    target = lines[0].split(b" ")
    if len(target) != 3 or target[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        return None
    close = target[2] == b"HTTP/1.0"
    host: bytes | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or name != name.strip():
            return None
        name, value = name.lower(), value.strip()
        if name == b"host":
            if host is not None:
                return None
            host = value
        elif name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return None
        elif name == b"connection" and b"close" in value.lower():
            close = True
    if host is None and not close:  # HTTP/1.1 needs a Host: the loop answers 400
        return None
    if host is not None and not host_allowed(host.decode("latin-1")):
        return None
    return end + 4, close


def health_answer(body: Mapping[str, object], *, close: bool) -> bytes:
    """The whole HTTP/1.1 200 response carrying *body* as JSON."""
    data = json.dumps(body, separators=(",", ":")).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
    head += b"content-length: %d\r\n" % len(data)
    if close:
        head += b"connection: close\r\n"
    return head + b"\r\n" + data


@final
class HealthGate:
    """Accepts on *listener* in a thread: answers health checks, hands the rest to *adopt*.

    Args:
        listener: a listening TCP socket; the gate makes it non-blocking and is its only
            acceptor (the caller closes it after :meth:`stop`).
        health: the body of ``/healthz``; called from the gate's thread, so it must only
            read (counts, flags).
        host_allowed: whether a ``Host`` header may be answered here.
        max_head: the largest request head answered here (the loop refuses larger ones).
        adopt: takes over a connection (a blocking socket with its bytes unread); called
            from the gate's thread, it must hand the socket to the loop thread-safely.
        failed: called once, from the thread, if the gate stops on an unexpected error
            (logged with its traceback): the server should stop, it accepts no more.
    """

    def __init__(
        self,
        listener: socket.socket,
        *,
        health: Callable[[], Mapping[str, object]],
        host_allowed: Callable[[str], bool],
        max_head: int,
        adopt: Callable[[socket.socket], None],
        failed: Callable[[], None],
    ) -> None:
        self._listener = listener
        self._health = health
        self._host_allowed = host_allowed
        self._max_head = max_head
        self._adopt = adopt
        self._failed = failed
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._held: dict[socket.socket, tuple[float, bool]] = {}  # deadline, new (adopt then)
        self._stopping = False
        self._resume_at: float | None = None  # accepting paused after an error until then
        self._thread = threading.Thread(target=self._run, name="sunroom-health", daemon=True)
        self.answered = 0
        """Health checks answered by the gate (read by tests and diagnostics)."""

    def start(self) -> None:
        """Start accepting."""
        self._listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting and close the connections the gate holds; idempotent."""
        self._stopping = True
        if self._thread.is_alive():
            self._wake_w.send(b"x")
            self._thread.join()
        for sock in list(self._held):
            self._drop(sock)
        if self._wake_w.fileno() >= 0:
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _run(self) -> None:
        try:
            while not self._stopping:
                now = time.monotonic()
                if self._resume_at is not None and now >= self._resume_at:
                    self._resume_at = None
                    self._selector.register(self._listener, selectors.EVENT_READ)
                soonest = min((d for d, _ in self._held.values()), default=now + 1.0)
                if self._resume_at is not None:
                    soonest = min(soonest, self._resume_at)
                for key, _ in self._selector.select(max(0.0, soonest - now)):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is not self._wake_r:
                        self._readable(self._sock(key.fileobj))
                self._expire(time.monotonic())
        except Exception:
            log.exception("the health gate failed; the server accepts no more connections")
            self._failed()

    @staticmethod
    def _sock(fileobj: object) -> socket.socket:
        assert isinstance(fileobj, socket.socket)
        return fileobj

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: pause, as asyncio's own accept loop does
                log.warning("accepting a connection failed (retrying in 1 s): %s", exc)
                self._selector.unregister(self._listener)
                self._resume_at = time.monotonic() + 1.0
                return
            if len(self._held) >= MAX_HELD:
                self._hand_over(sock)
                continue
            sock.setblocking(False)
            self._held[sock] = (time.monotonic() + HOLD_S, True)
            self._selector.register(sock, selectors.EVENT_READ)

    def _readable(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(self._max_head + 5, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sock)
            return
        if not data:  # the client closed it
            self._drop(sock)
            return
        parsed = parse_health_request(
            data, host_allowed=self._host_allowed, max_head=self._max_head
        )
        if parsed is None:
            self._release(sock)
            self._hand_over(sock)
            return
        length, close = parsed
        answer = health_answer(self._health(), close=close)
        try:
            sock.recv(length)  # the head peeked above: consumed now that it is answered
            sent = sock.send(answer)
        except OSError:
            self._drop(sock)
            return
        self.answered += 1
        if close or sent != len(answer):  # a client that does not read its answers is cut
            self._drop(sock)
        else:
            self._held[sock] = (time.monotonic() + KEEPALIVE_S, False)

    def _expire(self, now: float) -> None:
        for sock, (deadline, new) in list(self._held.items()):
            if deadline <= now:
                if new:  # silent so far: the loop's read deadline takes over
                    self._release(sock)
                    self._hand_over(sock)
                else:
                    self._drop(sock)

    def _release(self, sock: socket.socket) -> None:
        del self._held[sock]
        self._selector.unregister(sock)

    def _drop(self, sock: socket.socket) -> None:
        if sock in self._held:
            self._release(sock)
        sock.close()

    def _hand_over(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        try:
            self._adopt(sock)
        except RuntimeError:  # the loop is closed: the server is stopping
            sock.close()
