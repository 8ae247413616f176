"""The kernel's way out: a TCP listener on 127.0.0.1 inside the sandbox, relayed to the proxy.

A kernel with a network policy still has no network interface to the outside: its network
namespace holds only ``lo``. The host's egress proxy (:mod:`sunroom.network.proxy`) listens on
a Unix socket bound into the sandbox; this forwarder, a thread of the kernel's supervisor,
listens on ``127.0.0.1:PORT`` and pipes every TCP connection, byte for byte, to that socket.
It reads nothing and decides nothing: the proxy sees exactly what the client sent
(``CONNECT host:port`` or an absolute-form request) and applies the policy. ``HTTP_PROXY`` and
``HTTPS_PROXY`` in the kernel's environment name this listener.

Limits: at most :data:`MAX_CONNECTIONS` connections at once (a further one is closed at
once); :data:`CHUNK` bytes buffered per direction and connection (a side is not read while its
peer has not taken the last chunk). Stdlib only: this runs inside the kernel.

It relays through Python buffers (``recv``/``send``), 2 descriptors per connection. Relaying
with ``os.splice`` through a pipe per direction (6 descriptors) was measured and did not help
here: the download through proxy and forwarder reached -10 to +4 points of direct against
this path over 5 runs (docs/network.md, "The proxy"), so it was left out.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

MAX_CONNECTIONS = 256
"""Connections relayed at once; one more is accepted and closed at once."""
CHUNK = 256 * 1024
"""Bytes read at a time, and the most buffered per direction of one connection."""
CONNECT_TIMEOUT_S = 5.0
"""How long a connection to the proxy's socket may take before the client's is closed."""


def listen(port: int) -> socket.socket:
    """Bind and listen on ``127.0.0.1:port`` (before the kernel's code runs, so it is ours)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _Pipe:
    """One direction of a relayed connection: bytes read from *src*, waiting for *dst*."""

    __slots__ = ("src", "dst", "buf", "eof")

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src = src
        self.dst = dst
        self.buf = b""
        self.eof = False


class _Relay:
    """Both directions of one client connection and its connection to the proxy."""

    __slots__ = ("client", "upstream", "pipes", "closed")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.pipes = (_Pipe(client, upstream), _Pipe(upstream, client))
        self.closed = False


class Forwarder:
    """Relays TCP connections accepted on *listener* to the Unix socket at *target*."""

    def __init__(self, listener: socket.socket, target: str) -> None:
        self._listener = listener
        self._target = target
        self._sel = selectors.DefaultSelector()
        self._relays: dict[socket.socket, _Relay] = {}
        self._count = 0

    def start(self) -> threading.Thread:
        """Run :meth:`serve` in a daemon thread; return it."""
        thread = threading.Thread(target=self.serve, name="sunroom-forwarder", daemon=True)
        thread.start()
        return thread

    def serve(self) -> None:
        """Relay until the process ends."""
        self._sel.register(self._listener, selectors.EVENT_READ)
        while True:
            for key, _ in self._sel.select():
                sock = key.fileobj
                if sock is self._listener:
                    self._accept()
                else:
                    assert isinstance(sock, socket.socket)
                    relay = self._relays.get(sock)
                    if relay is not None and not relay.closed:
                        self._step(relay)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if self._count >= MAX_CONNECTIONS:
            client.close()
            return
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:  # no descriptor left (EMFILE): like a connection over the limit
            client.close()
            return
        try:
            upstream.settimeout(CONNECT_TIMEOUT_S)
            upstream.connect(self._target)
        except OSError:
            upstream.close()
            client.close()  # the client sees its connection closed: no proxy to talk to
            return
        client.setblocking(False)
        upstream.setblocking(False)
        relay = _Relay(client, upstream)
        self._relays[client] = self._relays[upstream] = relay
        self._count += 1
        self._sel.register(client, selectors.EVENT_READ)
        self._sel.register(upstream, selectors.EVENT_READ)

    def _step(self, relay: _Relay) -> None:
        """Move what can move on both directions of *relay*, then update what it waits for."""
        for pipe in relay.pipes:
            if not pipe.buf and not pipe.eof:
                try:
                    data = pipe.src.recv(CHUNK)
                except (BlockingIOError, InterruptedError):
                    data = None
                except OSError:
                    data = b""
                if data is not None:
                    if data:
                        pipe.buf = data
                    else:
                        pipe.eof = True
            if pipe.buf:
                try:
                    sent = pipe.dst.send(pipe.buf)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    self._close(relay)
                    return
                pipe.buf = pipe.buf[sent:]
            if pipe.eof and not pipe.buf:
                with contextlib.suppress(OSError):
                    pipe.dst.shutdown(socket.SHUT_WR)
        if all(p.eof and not p.buf for p in relay.pipes):
            self._close(relay)
            return
        for sock in (relay.client, relay.upstream):
            events = 0
            for pipe in relay.pipes:
                if pipe.src is sock and not pipe.eof and not pipe.buf:
                    events |= selectors.EVENT_READ
                if pipe.dst is sock and pipe.buf:
                    events |= selectors.EVENT_WRITE
            self._want(sock, events)

    def _want(self, sock: socket.socket, events: int) -> None:
        """Wait for *events* on *sock* (0: not at all; its peer's progress will wake it)."""
        try:
            key = self._sel.get_key(sock)
        except KeyError:
            if events:
                self._sel.register(sock, events)
            return
        if not events:
            self._sel.unregister(sock)
        elif key.events != events:
            self._sel.modify(sock, events)

    def _close(self, relay: _Relay) -> None:
        relay.closed = True
        self._count -= 1
        for sock in (relay.client, relay.upstream):
            self._relays.pop(sock, None)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(sock)
            sock.close()


def start(port: int, target: str) -> threading.Thread:
    """Listen on ``127.0.0.1:port`` and relay to *target* in a daemon thread."""
    return Forwarder(listen(port), target).start()
