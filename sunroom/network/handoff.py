"""The hand-off socket: a kernel's supervisor gives its ``127.0.0.1`` listener to the proxy.

Before a kernel's code runs, its supervisor binds ``127.0.0.1:PORT`` inside the sandbox and
sends the listening socket's descriptor over a Unix socket to the host's egress proxy
(``SCM_RIGHTS``, one byte and one descriptor per message; :mod:`sunroom.prelude.egress`). The
proxy then accepts the kernel's TCP connections itself, on the host: nothing in the sandbox
relays them, so a byte crosses one relay (the proxy), and the kernel never holds the listener.

The descriptors come from the sandbox, so each is checked before use (:func:`listener_of`): it
must be a listening ``AF_INET``/``AF_INET6`` stream socket; anything else (a file, a pipe, a
connected, Unix or UDP socket) is closed unused and logged. A descriptor grants the proxy only
what its sender already had; the proxy only accepts on it and reads and writes the accepted
connections, as on its own socket (it never binds or connects it).

Limits: at most :data:`MAX_SENDERS` connections to the hand-off socket at once (more are closed
at once), :data:`MAX_FDS` descriptors read per message (the kernel discards the rest) and
:data:`MAX_LISTENERS` listeners per proxy (the supervisor sends one; more are closed). The
proxy's own ``max_connections`` bounds the connections it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

__all__ = ["MAX_FDS", "MAX_LISTENERS", "MAX_SENDERS", "HandoffListener", "listener_of"]

log = logging.getLogger(__name__)

MAX_SENDERS = 16
"""Connections to the hand-off socket at once (a kernel's supervisor makes one, briefly)."""
MAX_FDS = 16
"""Descriptors taken from one message; the kernel closes any beyond them."""
MAX_LISTENERS = 4
"""Listeners one proxy takes over its life; one more is closed unused."""
_MESSAGE_BYTES = 256


def listener_of(fd: int) -> socket.socket | None:
    """The listening TCP socket *fd* is, owning *fd*; or None with *fd* closed.

    Refused: anything not a socket, a socket not ``AF_INET``/``AF_INET6``, not a stream, or
    not listening.
    """
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # not a socket (ENOTSOCK), or its options cannot be read
        os.close(fd)
        return None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        listening = 0
    if (
        sock.family not in (socket.AF_INET, socket.AF_INET6)
        or sock.type != socket.SOCK_STREAM
        or not listening
    ):
        sock.close()
        return None
    return sock


class HandoffListener:
    """Listens on a Unix socket and gives every TCP listener handed over to ``adopt``.

    ``adopt`` gets each valid listener (non-blocking, owned by the callee), at most
    :data:`MAX_LISTENERS` of them; it runs on the event loop and must not block. Refused
    descriptors are closed and counted in ``refused``.
    """

    def __init__(self, adopt: Callable[[socket.socket], None]) -> None:
        self._adopt = adopt
        self._listener: socket.socket | None = None
        self._senders: set[socket.socket] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.adopted = 0
        self.refused = 0

    def start(self, path: Path) -> None:
        """Bind and listen on *path* (a stale socket there is replaced) in the running loop."""
        with contextlib.suppress(FileNotFoundError):
            if path.is_socket():
                path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
            listener.listen(MAX_SENDERS)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._loop = asyncio.get_running_loop()
        self._listener = listener
        self._loop.add_reader(listener, self._accept)

    def close(self) -> None:
        """Stop listening and drop every sender; idempotent. Adopted sockets are the callee's."""
        if self._loop is None:
            return
        for sock in [*self._senders, *([self._listener] if self._listener else [])]:
            self._loop.remove_reader(sock)
            sock.close()
        self._senders.clear()
        self._listener = None
        self._loop = None

    def _accept(self) -> None:
        assert self._listener is not None
        assert self._loop is not None
        try:
            sender, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError:  # EMFILE and the like: the sender sees its connection refused
            log.warning("egress hand-off: could not accept a connection", exc_info=True)
            return
        if len(self._senders) >= MAX_SENDERS:
            sender.close()
            return
        sender.setblocking(False)
        self._senders.add(sender)
        self._loop.add_reader(sender, self._receive, sender)

    def _receive(self, sender: socket.socket) -> None:
        try:
            _, fds, _, _ = socket.recv_fds(sender, _MESSAGE_BYTES, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            fds = []
        for fd in fds:
            sock = listener_of(fd)
            if sock is None or self.adopted >= MAX_LISTENERS:
                if sock is not None:
                    sock.close()
                self.refused += 1
                log.warning("egress hand-off: refused a descriptor (not a listener, or too many)")
                continue
            self.adopted += 1
            sock.setblocking(False)
            self._adopt(sock)
        if not fds:  # the sender closed its end, or sent bytes without a descriptor
            self._drop(sender)

    def _drop(self, sender: socket.socket) -> None:
        if self._loop is not None:
            self._loop.remove_reader(sender)
        self._senders.discard(sender)
        sender.close()
