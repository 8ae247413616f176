"""A kernel's network policy in its sandbox: the proxy's socket, its listener, the environment.

A kernel with ``network=Network(...)`` gets, per launch, an egress proxy on the host
(:class:`~sunroom.network.proxy.EgressProxy`) listening on a Unix socket in a directory private
to the kernel's uid; the backend binds that directory read-only at :data:`NET_DIR` in the
sandbox, compiles its seccomp filter with ``AF_INET`` stream sockets allowed, and has the
supervisor bind ``127.0.0.1:PROXY_PORT`` and hand that listener to the proxy through the socket
before the kernel starts, so the proxy accepts the kernel's connections itself
(:mod:`sunroom.prelude.egress`, :mod:`sunroom.network.handoff`).
The kernel's environment names the proxy (``HTTP_PROXY``, ``HTTPS_PROXY``, pip's
``PIP_PROXY``) and, in the terminating TLS mode, a CA bundle that trusts the proxy's
per-kernel CA. Nothing else changes: the network namespace still has only ``lo``.

The proxy lives as long as the sandbox: the process handle closes it after the tree is dead
(``companions``), so a forked copy that outlives its parent keeps its way out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sunroom.errors import UsageError

if TYPE_CHECKING:  # the proxy's modules load when a kernel with a policy starts, not before
    from sunroom.network.policy import Network
    from sunroom.network.proxy import Connection, EgressProxy
    from sunroom.sandbox.identity import Identity

NET_DIR: Final = "/run/sunroom-net"
"""Where a kernel's network directory (the proxy's socket, the CA bundle) is bound."""
PROXY_PORT: Final = 3128
"""The proxy's port on 127.0.0.1 inside the sandbox (its listener is handed to the host)."""
SOCKET_NAME: Final = "proxy.sock"
BUNDLE_NAME: Final = "ca-bundle.pem"
NETWORK_BACKENDS: Final = ("bwrap", "docker")
"""Backends that can enforce a network policy (their kernels have no network of their own)."""


@dataclass(frozen=True, kw_only=True)
class Egress:
    """What a launch needs to give a kernel its network: the policy and where events go.

    *on_connection* gets one record per connection (allowed or refused) when it ends;
    *charge* is asked, with every relayed chunk's size, whether the bytes may pass (False
    ends the connection: a byte budget is spent).
    """

    network: Network
    on_connection: Callable[[Connection], None] | None = None
    charge: Callable[[int], bool] | None = None

    def environment(self) -> dict[str, str]:
        """The kernel's proxy environment (as the kernel sees :data:`NET_DIR`)."""
        url = f"http://127.0.0.1:{PROXY_PORT}"
        env = {
            "HTTP_PROXY": url,
            "HTTPS_PROXY": url,
            "http_proxy": url,
            "https_proxy": url,
            "PIP_PROXY": url,
            "NO_PROXY": "localhost,127.0.0.1,::1",
            "no_proxy": "localhost,127.0.0.1,::1",
        }
        if self.network.tls == "terminate":
            bundle = f"{NET_DIR}/{BUNDLE_NAME}"
            for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"):
                env[name] = bundle
        return env

    def supervisor_config(self) -> dict[str, Any]:
        """The supervisor's ``forward`` config."""
        return {"port": PROXY_PORT, "socket": f"{NET_DIR}/{SOCKET_NAME}"}

    async def open(self, directory: Path, identity: Identity | None) -> EgressRun:
        """Create *directory* with the proxy listening in it; the caller closes the proxy.

        The proxy runs on the egress thread (:mod:`sunroom.network.egress_thread`);
        ``on_connection`` is called on the caller's loop, ``charge`` on the egress thread or a
        tunnel's relay thread (it must be thread-safe). As root (the kernel has a leased uid),
        the directory and socket belong to root with the kernel's group (0750 / 0660): the
        kernel may connect and read the bundle, and nobody else on the host may. Unprivileged,
        the socket is open to any uid and the caller's private (0700) parent keeps other users
        out.
        """
        from sunroom.network import EgressProxy, ca_bundle
        from sunroom.network.egress_thread import on_caller, on_egress

        os.mkdir(directory, 0o700)
        # the byte cap is the kernel's, over all its launches: it is kept by *charge*
        policy = dataclasses.replace(self.network, max_bytes=None)
        records = on_caller(self.on_connection) if self.on_connection is not None else None
        proxy = EgressProxy(policy, on_connection=records, charge=self.charge)
        run = EgressRun(proxy)
        try:
            await on_egress(proxy.start(directory / SOCKET_NAME, handoff=True))
            bundle = None
            if self.network.tls == "terminate":
                assert proxy.ca_pem is not None
                bundle = ca_bundle(proxy.ca_pem)
            _share(directory, bundle, identity)
        except BaseException:
            await run.aclose()
            raise
        return run


@dataclass(frozen=True)
class EgressRun:
    """A kernel launch's proxy on the egress thread, closed from the caller's loop (a companion)."""

    proxy: EgressProxy

    async def aclose(self) -> None:
        """End the proxy's connections and remove its socket; idempotent.

        The close runs to its end on the egress thread even if the caller is cancelled
        meanwhile (a half-closed proxy would keep its sockets).
        """
        from sunroom.network.egress_thread import on_egress

        await asyncio.shield(on_egress(self.proxy.aclose()))


def _share(directory: Path, bundle: bytes | None, identity: Identity | None) -> None:
    """Write the CA bundle and open *directory* and its socket to the kernel (see Egress.open)."""
    if bundle is not None:
        path = directory / BUNDLE_NAME
        path.write_bytes(bundle)
        os.chmod(path, 0o644)
    sock = directory / SOCKET_NAME
    if identity is not None and os.geteuid() == 0:
        os.chown(sock, -1, identity.gid)
        os.chmod(sock, 0o660)
        os.chown(directory, -1, identity.gid)
        os.chmod(directory, 0o750)
    else:  # the kernel's uid may differ (docker): the private parent keeps others out
        os.chmod(sock, 0o666)
        os.chmod(directory, 0o711)


class KernelNetwork:
    """One kernel's network policy across its launches (restarts): its bytes and its records.

    Every launch gets its own proxy (:class:`Egress`), but the bytes are counted here, over
    all of them, against ``Network.max_bytes``: a restart does not refill the budget, and a
    chunk that would pass the cap is not relayed (its connection is cut).
    ``bytes_total`` is what crossed so far; ``connections`` the number of records seen.
    """

    def __init__(
        self,
        network: Network,
        *,
        on_connection: Callable[[Connection], None] | None = None,
    ) -> None:
        from sunroom.network.policy import Network

        if not isinstance(network, Network):
            raise UsageError("network must be a sunroom.Network")
        self.network = network
        self._on_connection = on_connection
        self._meters: list[Callable[[int], bool]] = []
        self._lock = threading.Lock()
        self.bytes_total = 0
        self.connections = 0

    def meter(self, charge: Callable[[int], bool]) -> None:
        """Also ask *charge* (a session's budget) about every chunk; False cuts the connection.

        *charge* is called on the egress thread or a relay thread: it must be thread-safe.
        """
        self._meters.append(charge)

    @staticmethod
    def check_backend(name: str, sandbox: str | None = None) -> None:
        """Raise UsageError unless backend *name* can enforce a policy.

        A Jupyter kernel (``name`` ``"jupyter"``) can when its *sandbox* can (the default,
        bwrap, can).
        """
        if name == "jupyter" and (sandbox or "bwrap") in NETWORK_BACKENDS:
            return
        if name not in NETWORK_BACKENDS:
            raise UsageError(
                f"the {name!r} backend cannot enforce a network policy (its kernels share the "
                "host's network, or it has no sandbox of its own): use backend='bwrap' or "
                "backend='docker'"
            )

    def egress(self) -> Egress:
        """The launch's egress: records go to ``on_connection``, bytes count here."""
        return Egress(network=self.network, on_connection=self._record, charge=self._charge)

    def _charge(self, size: int) -> bool:
        """Whether *size* more bytes may cross; a chunk that would pass the cap does not.

        Called on the egress thread (every launch's proxy runs there) or on a tunnel's relay
        thread, under a lock.
        """
        with self._lock:
            cap = self.network.max_bytes
            if cap is not None and self.bytes_total + size > cap:
                return False
            if not all(charge(size) for charge in self._meters):
                return False
            self.bytes_total += size
            return True

    def _record(self, connection: Connection) -> None:
        self.connections += 1
        if self._on_connection is not None:
            self._on_connection(connection)
