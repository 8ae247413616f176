"""The kernel's way out: a TCP listener on 127.0.0.1 inside the sandbox, owned by the host's proxy.

A kernel with a network policy still has no network interface to the outside: its network
namespace holds only ``lo``. Before the kernel's code runs, its supervisor binds
``127.0.0.1:PORT`` in that namespace (so the port is the proxy's, not the code's), sends the
listening socket's descriptor to the host's egress proxy over the Unix socket bound into the
sandbox (``SCM_RIGHTS``, one byte and one descriptor; :mod:`sunroom.network.handoff`) and
closes its own copy. From then on the proxy accepts the kernel's connections itself, from the
host, and applies the policy: no process in the sandbox relays, reads or holds them, and the
kernel's processes never had the descriptor. ``HTTP_PROXY`` and ``HTTPS_PROXY`` in the kernel's
environment name this listener.

Stdlib only: this runs inside the kernel (in its supervisor, before the kernel is forked).
"""

from __future__ import annotations

import socket

BACKLOG = 128
"""Connections the listener queues for the proxy to accept."""
HANDOFF_TIMEOUT_S = 5.0
"""How long reaching the proxy's socket and sending the listener may take."""


def listen(port: int) -> socket.socket:
    """Bind and listen on ``127.0.0.1:port``."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def hand_over(listener: socket.socket, target: str) -> None:
    """Send *listener* to the proxy listening on the Unix socket *target*; OSError if it cannot.

    The caller closes its own copy afterwards (the proxy keeps the socket open).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as proxy:
        proxy.settimeout(HANDOFF_TIMEOUT_S)
        proxy.connect(target)
        socket.send_fds(proxy, [b"\x01"], [listener.fileno()])


def open_way_out(port: int, target: str) -> None:
    """Bind ``127.0.0.1:port`` and give it to the proxy at *target*; keep no descriptor.

    Raises OSError when the port cannot be bound or the proxy cannot be reached: a kernel
    whose way out is not the proxy's must not start.
    """
    with listen(port) as listener:
        hand_over(listener, target)
