"""Kernels on uvloop: started as their leased user, isolated, forked and networked as on asyncio.

Kernels are started with ``subprocess.Popen`` and reaped through a pidfd on whichever loop
runs (sunroom.sandbox.child), and drop to their identity with ``setpriv`` where it is installed
(sunroom.sandbox.process). As root a kernel on uvloop must be exactly what one on asyncio is:
every uid and gid (real, effective, saved, filesystem) the leased one, no supplementary group,
no capability.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import threading
from typing import Any

import pytest
import uvloop

from sunroom import AsyncKernel, Limits, Network

pytestmark = pytest.mark.usefixtures("no_process_left")

LIMITS = Limits(timeout_s=60, memory_mb=512)
STATUS = (
    "lines = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines())\n"
    "{k: lines[k].split() for k in ('Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', "
    "'CapAmb', 'NoNewPrivs')}"
)


async def _status(backend: str) -> dict[str, list[str]]:
    async with AsyncKernel(backend=backend, limits=LIMITS) as k:
        r = await k.execute(STATUS)
        assert r.ok, r.error
        assert r.value is not None
        status: dict[str, list[str]] = eval(r.value)
        return status


@pytest.mark.parametrize("backend", ["subprocess", "bwrap"])
def test_a_kernel_on_uvloop_has_the_same_identity_as_on_asyncio(backend: str) -> None:
    on_uvloop = uvloop.run(_status(backend))
    on_asyncio = asyncio.run(_status(backend))
    for status in (on_uvloop, on_asyncio):
        assert len(set(status["Uid"])) == 1 and len(set(status["Gid"])) == 1
        assert status["CapPrm"] == status["CapEff"] == status["CapAmb"] == ["0000000000000000"]
    if os.geteuid() == 0:  # a leased, unprivileged uid (each kernel its own)
        assert on_uvloop["Uid"][0] != "0" and on_uvloop["Gid"][0] != "0"
    assert on_uvloop["Groups"] == on_asyncio["Groups"]
    assert on_uvloop["NoNewPrivs"] == on_asyncio["NoNewPrivs"]


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: Any) -> None:
        pass


def test_a_network_kernel_on_uvloop_fetches_through_its_proxy_and_forks() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    network = Network(
        allow=[f"api.test:{port}"], hosts={"api.test": "127.0.0.1"}, allow_addresses=["127.0.0.1"]
    )
    fetch = f"import urllib.request\nurllib.request.urlopen('http://api.test:{port}/').read()"

    async def main() -> tuple[str | None, str | None]:
        async with AsyncKernel(backend="bwrap", limits=LIMITS, network=network) as k:
            fetched = (await k.execute(fetch)).value
            [copy] = await k.fork()
            async with copy:
                return fetched, (await copy.execute(fetch)).value

    try:
        assert uvloop.run(main()) == ("b'hello'", "b'hello'")
    finally:
        server.shutdown()
        server.server_close()
