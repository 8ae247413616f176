"""The kernel's way out: a TCP listener on 127.0.0.1 inside the sandbox, relayed to the proxy.

A kernel with a network policy still has no network interface to the outside: its network
namespace holds only ``lo``. The host's egress proxy (:mod:`sunroom.network.proxy`) listens on
a Unix socket bound into the sandbox; this forwarder, a thread of the kernel's supervisor,
listens on ``127.0.0.1:PORT`` and pipes every TCP connection, byte for byte, to that socket.
It reads nothing and decides nothing: the proxy sees exactly what the client sent
(``CONNECT host:port`` or an absolute-form request) and applies the policy. ``HTTP_PROXY`` and
``HTTPS_PROXY`` in the kernel's environment name this listener.

Limits: at most :data:`MAX_CONNECTIONS` connections at once, fewer if the descriptor limit
holds fewer (:func:`connection_cap`; a further one is closed at once); :data:`CHUNK` bytes
buffered per direction and connection (a side is not read while its peer has not taken the last
chunk). Stdlib only: this runs inside the kernel.

On Linux the bytes move with ``os.splice`` through a pipe per direction (socket -> pipe ->
socket, never entering Python): each connection then holds :data:`FDS_PER_CONNECTION`
descriptors (its two sockets and two pipes of two ends), so :data:`MAX_CONNECTIONS` of them
take 1536 beside the listener. The supervisor's own soft ``RLIMIT_NOFILE``
(``Limits.open_files`` binds the kernel's processes, not it) may lower the cap
(:func:`connection_cap`); a connection that cannot get its descriptors (``EMFILE``) is closed
at once, like one over the cap. Where splice is unavailable (no ``os.splice``, or a probe from
a Unix socketpair into a pipe failing with EINVAL, ENOSYS, EPERM or EOPNOTSUPP) each direction
is ``recv`` into a buffer and ``send`` out of it, two descriptors per connection.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import resource
import selectors
import socket
import threading

MAX_CONNECTIONS = 256
"""Connections relayed at once; one more is accepted and closed at once."""
CHUNK = 256 * 1024
"""Bytes read at a time, and the most buffered per direction of one connection."""
CONNECT_TIMEOUT_S = 5.0
"""How long a connection to the proxy's socket may take before the client's is closed."""
FDS_PER_CONNECTION = 6
"""Descriptors one relayed connection holds with splice: 2 sockets + 2 pipes x 2 ends."""
RESERVED_FDS = 64
"""Descriptors left to the rest of the supervisor when the connection cap is derived."""
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


@functools.cache
def splice_works() -> bool:
    """Whether ``os.splice`` works here, probed once: a Unix socketpair into a pipe and out."""
    if not hasattr(os, "splice"):
        return False
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        a.sendall(b"x")
        return os.splice(b.fileno(), w, 1) == 1 and os.splice(r, a.fileno(), 1) == 1
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EPERM, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def connection_cap(open_files: int, *, splice: bool) -> int:
    """Connections relayed at once within ``open_files`` descriptors (``RLIMIT_NOFILE``).

    :data:`MAX_CONNECTIONS` at most; :data:`RESERVED_FDS` stay free, and each connection takes
    :data:`FDS_PER_CONNECTION` with splice, 2 without (e.g. 1024 descriptors: 160 with splice).
    """
    per = FDS_PER_CONNECTION if splice else 2
    return max(1, min(MAX_CONNECTIONS, (open_files - RESERVED_FDS) // per))


def listen(port: int) -> socket.socket:
    """Bind and listen on ``127.0.0.1:port`` (before the kernel's code runs, so it is ours)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class _Pipe:
    """One direction of a relayed connection: bytes read from *src*, waiting for *dst*.

    They wait in a kernel pipe (``r``/``w``; ``held`` bytes) when splice works, else in
    ``buf``. A chunk is read only when the last one has gone out.
    """

    __slots__ = ("src", "dst", "buf", "held", "eof", "r", "w")

    def __init__(self, src: socket.socket, dst: socket.socket, *, splice: bool) -> None:
        self.src = src
        self.dst = dst
        self.buf = b""
        self.held = 0
        self.eof = False
        self.r = self.w = -1
        if splice:
            self.r, self.w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            with contextlib.suppress(OSError):  # the default 64 KiB pipe works too
                fcntl.fcntl(self.w, fcntl.F_SETPIPE_SZ, CHUNK)

    def pending(self) -> bool:
        """Whether bytes read from *src* still wait for *dst*."""
        return bool(self.buf) or self.held > 0

    def fill(self) -> None:
        """Read one chunk from *src* if it has one (an error reads as its end)."""
        try:
            if self.r >= 0:
                n = os.splice(self.src.fileno(), self.w, CHUNK, flags=_SPLICE_FLAGS)
                self.held, self.eof = n, n == 0
            else:
                data = self.src.recv(CHUNK)
                self.buf, self.eof = data, not data
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.eof = True

    def flush(self) -> None:
        """Write what waits to *dst* as far as it takes it; OSError if *dst* is gone."""
        try:
            if self.r >= 0:
                self.held -= os.splice(self.r, self.dst.fileno(), self.held, flags=_SPLICE_FLAGS)
            else:
                self.buf = self.buf[self.dst.send(self.buf) :]
        except (BlockingIOError, InterruptedError):
            return

    def close(self) -> None:
        """Close the pipe (the sockets belong to the relay)."""
        for fd in (self.r, self.w):
            if fd >= 0:
                os.close(fd)
        self.r = self.w = -1


class _Relay:
    """Both directions of one client connection and its connection to the proxy."""

    __slots__ = ("client", "upstream", "pipes", "closed")

    def __init__(self, client: socket.socket, upstream: socket.socket, *, splice: bool) -> None:
        self.client = client
        self.upstream = upstream
        forth = _Pipe(client, upstream, splice=splice)
        try:
            back = _Pipe(upstream, client, splice=splice)
        except OSError:
            forth.close()
            raise
        self.pipes = (forth, back)
        self.closed = False


class Forwarder:
    """Relays TCP connections accepted on *listener* to the Unix socket at *target*."""

    def __init__(self, listener: socket.socket, target: str, *, splice: bool | None = None) -> None:
        """``splice``: relay through pipes with splice (None: where :func:`splice_works`).

        ``cap`` is how many connections are relayed at once (:func:`connection_cap` of this
        process's soft ``RLIMIT_NOFILE``); one more is accepted and closed at once.
        """
        self._listener = listener
        self._target = target
        self._splice = splice_works() if splice is None else splice
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.cap = connection_cap(
            1 << 20 if soft == resource.RLIM_INFINITY else soft, splice=self._splice
        )
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
        if self._count >= self.cap:
            client.close()
            return
        try:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:  # no descriptor left: like a connection over the cap
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
        try:
            relay = _Relay(client, upstream, splice=self._splice)
        except OSError:  # no descriptors left for its pipes: like a connection over the limit
            upstream.close()
            client.close()
            return
        self._relays[client] = self._relays[upstream] = relay
        self._count += 1
        self._sel.register(client, selectors.EVENT_READ)
        self._sel.register(upstream, selectors.EVENT_READ)

    def _step(self, relay: _Relay) -> None:
        """Move what can move on both directions of *relay*, then update what it waits for."""
        for pipe in relay.pipes:
            if not pipe.pending() and not pipe.eof:
                pipe.fill()
            if pipe.pending():
                try:
                    pipe.flush()
                except OSError:
                    self._close(relay)
                    return
            if pipe.eof and not pipe.pending():
                with contextlib.suppress(OSError):
                    pipe.dst.shutdown(socket.SHUT_WR)
        if all(p.eof and not p.pending() for p in relay.pipes):
            self._close(relay)
            return
        for sock in (relay.client, relay.upstream):
            events = 0
            for pipe in relay.pipes:
                if pipe.src is sock and not pipe.eof and not pipe.pending():
                    events |= selectors.EVENT_READ
                if pipe.dst is sock and pipe.pending():
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
        for pipe in relay.pipes:
            pipe.close()
        for sock in (relay.client, relay.upstream):
            self._relays.pop(sock, None)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(sock)
            sock.close()


def start(port: int, target: str) -> threading.Thread:
    """Listen on ``127.0.0.1:port`` and relay to *target* in a daemon thread."""
    return Forwarder(listen(port), target).start()
