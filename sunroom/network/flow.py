"""The record of one proxied connection, its mutable bookkeeping and the byte meter.

:class:`Connection` is what ``on_connection`` receives; :class:`Flow` is the state a connection
fills in while it runs; :class:`Meter` charges every relayed chunk against the policy's
``max_bytes`` and the caller's ``charge`` before the chunk passes. :class:`Refused` and
:class:`Ended` are the proxy's internal ways to end a connection (an HTTP refusal, or an early
end with a reason for the record); neither leaves the proxy.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Connection", "Ended", "Flow", "Meter", "Refused", "shown"]


@dataclass(frozen=True, slots=True)
class Connection:
    """One connection through the proxy, allowed or refused, recorded when it ends.

    ``bytes_sent`` went kernel -> upstream and ``bytes_received`` upstream -> kernel (the
    payload relayed; for forwarded requests, the messages as written and read upstream).
    ``reason`` says why it was refused or ended early (None: it ran and ended normally).
    ``injected`` says headers were injected, never which. ``method`` is the plain HTTP (or
    terminated HTTPS) method; None for a CONNECT relayed as is.
    """

    host: str
    port: int
    scheme: str
    allowed: bool
    reason: str | None
    address: str | None
    bytes_sent: int
    bytes_received: int
    duration_s: float
    injected: bool
    method: str | None


class Refused(Exception):
    """A refusal answered with ``status`` and a one-sentence body."""

    def __init__(self, status: int, reason: str, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status
        self.reason = reason
        self.sentence = sentence


class Ended(Exception):
    """The connection must end early; ``reason`` goes into its record."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Flow:
    """The mutable state of one connection, frozen into a :class:`Connection` at the end."""

    def __init__(self) -> None:
        self.host = ""
        self.port = 0
        self.scheme = "http"
        self.allowed = False
        self.reason: str | None = None
        self.address: str | None = None
        self.sent = 0
        self.received = 0
        self.injected = False
        self.method: str | None = None
        self.started = time.monotonic()
        self.active = self.started
        """When a byte last passed either way (``time.monotonic()``; relay threads set it too)."""
        self.upstream: asyncio.StreamWriter | None = None
        self.finished = False

    def record(self) -> Connection:
        """The record of this connection as it stands (its duration up to now)."""
        return Connection(
            host=self.host,
            port=self.port,
            scheme=self.scheme,
            allowed=self.allowed,
            reason=self.reason,
            address=self.address,
            bytes_sent=self.sent,
            bytes_received=self.received,
            duration_s=time.monotonic() - self.started,
            injected=self.injected,
            method=self.method,
        )


class Meter:
    """The bytes one proxy relayed, charged chunk by chunk before each chunk passes.

    ``total`` never exceeds ``max_bytes``; once a chunk is refused (by ``max_bytes`` or by
    ``charge`` returning False) ``spent`` stays True and every later chunk is refused too.
    :meth:`count` may be called from any thread (the relay threads call it): one lock orders
    the charges, ``charge`` included.
    """

    def __init__(self, max_bytes: int | None, charge: Callable[[int], bool] | None) -> None:
        self._lock = threading.Lock()
        self.max_bytes = max_bytes
        self.charge = charge
        self.total = 0
        self.spent = False

    def count(self, flow: Flow, n: int, *, outbound: bool) -> None:
        """Charge ``n`` bytes of ``flow``; raise :class:`Ended` (they must not pass) if over."""
        with self._lock:
            if (
                self.spent
                or (self.max_bytes is not None and self.total + n > self.max_bytes)
                or (self.charge is not None and not self.charge(n))
            ):
                self.spent = True
                raise Ended("byte budget spent")
            self.total += n
            if outbound:
                flow.sent += n
            else:
                flow.received += n
        flow.active = time.monotonic()


def shown(host: str, port: int) -> str:
    """``host:port`` as written in messages (an IPv6 literal in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
