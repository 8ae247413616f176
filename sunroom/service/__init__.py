"""The HTTP/SSE service: agent sessions and raw kernels over HTTP, durable in the store.

:func:`~sunroom.service.app.create_app` builds the ASGI app (Starlette);
:func:`~sunroom.service.server.serve` runs it with uvicorn (``sunroom serve``). Sessions are
persisted event by event and resumed after a crash (:mod:`sunroom.service.sessions`). The
guide is ``docs/service.md``.

The names below are imported on first use: the session manager and its configuration (which
``sunroom run`` uses) need no web framework, while the app and the server need
``sunroom[service]`` and say so when it is missing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sunroom.extras import require

if TYPE_CHECKING:
    from sunroom.service.app import create_app
    from sunroom.service.config import ServiceConfig
    from sunroom.service.functions import load_functions
    from sunroom.service.kernels import KernelManager
    from sunroom.service.models import resolve_model
    from sunroom.service.server import bind, serve
    from sunroom.service.sessions import ModelResolver, SessionManager

__all__ = [
    "KernelManager",
    "ModelResolver",
    "ServiceConfig",
    "SessionManager",
    "bind",
    "create_app",
    "load_functions",
    "resolve_model",
    "serve",
]

_HOMES = {
    "create_app": "app",
    "load_functions": "functions",
    "ServiceConfig": "config",
    "KernelManager": "kernels",
    "resolve_model": "models",
    "bind": "server",
    "serve": "server",
    "ModelResolver": "sessions",
    "SessionManager": "sessions",
}
_WEB = {"app", "server"}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if home in _WEB:
        require("service", "the HTTP service")
    return getattr(importlib.import_module(f"sunroom.service.{home}"), name)
