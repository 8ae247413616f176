"""The Python client of ``sunroom serve``: :class:`AsyncClient` and its sync twin :class:`Client`.

Sessions (create, send, events with resume, result, approvals), raw kernels (create, execute,
files, fork, close), over HTTP with the server's bearer token; the service's errors come back
as the classes of sunroom's one error tree (:mod:`sunroom.client.problems`). It needs
``sunroom[client]`` (httpx), not the service's web framework; docs/service.md ("Python
client") is the guide. A raw kernel whose server died raises :class:`KernelLost` (its state
is gone; delete it and create a new one).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sunroom.extras import require

if TYPE_CHECKING:
    from sunroom.client.async_client import AsyncClient
    from sunroom.client.problems import KernelLost
    from sunroom.client.sse import SessionEvent
    from sunroom.client.sync_client import Client

__all__ = ["AsyncClient", "Client", "KernelLost", "SessionEvent"]

_HOMES = {
    "AsyncClient": "async_client",
    "Client": "sync_client",
    "KernelLost": "problems",
    "SessionEvent": "sse",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    require("client", "sunroom.client")
    return getattr(importlib.import_module(f"sunroom.client.{home}"), name)
