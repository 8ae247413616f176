"""Serving the app with uvicorn: :func:`bind` and :func:`serve`.

The socket is bound before uvicorn starts, so the caller knows the port (also for port 0)
and can print the URL and token first.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn

from sunroom.sandbox.functions import HostFunction
from sunroom.service.app import create_app
from sunroom.service.config import ServiceConfig
from sunroom.service.models import resolve_model
from sunroom.service.sessions import ModelResolver

__all__ = ["bind", "serve"]


def bind(config: ServiceConfig) -> socket.socket:
    """A listening TCP socket on ``config.host:config.port``. Raises OSError."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # proto=IPPROTO_TCP lets asyncio set TCP_NODELAY on every accepted connection (it checks
    # the protocol number); TCP_NODELAY on the listener is inherited as well. Without it,
    # Nagle's algorithm and the client's delayed ACK add ~40 ms to each keep-alive response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((config.host, config.port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


async def serve(
    config: ServiceConfig,
    *,
    sock: socket.socket | None = None,
    resolve: ModelResolver = resolve_model,
    functions: Sequence[Callable[..., Any] | HostFunction] = (),
    log_level: str = "warning",
    started: Callable[[uvicorn.Server], None] | None = None,
) -> None:
    """Run the service until the server is told to exit (SIGINT/SIGTERM, ``should_exit``).

    *config* must carry a token. *started* is called with the uvicorn server once it serves.
    """
    app = create_app(config, resolve=resolve, functions=functions)
    sock = sock or bind(config)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=5,
            access_log=False,
        )
    )
    if started is not None:

        async def announce() -> None:
            while not server.started and not server.should_exit:  # noqa: ASYNC110 - a bool flag
                await asyncio.sleep(0.01)
            if server.started:
                started(server)

        task = asyncio.get_running_loop().create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        if started is not None:
            task.cancel()
        sock.close()
