"""The HTTP/SSE service: agent sessions and raw kernels over HTTP, durable in the store.

:func:`~sunroom.service.app.create_app` builds the ASGI app (Starlette);
:func:`~sunroom.service.server.serve` runs it with uvicorn (``sunroom serve``). Sessions are
persisted event by event and resumed after a crash (:mod:`sunroom.service.sessions`). The
guide is ``docs/service.md``.
"""

from __future__ import annotations

from sunroom.service.app import create_app, load_functions
from sunroom.service.config import ServiceConfig
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
