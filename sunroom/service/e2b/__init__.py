"""An E2B-compatible API inside ``sunroom serve`` (docs/integrations.md, "E2B").

E2B's ``e2b-code-interpreter`` SDK, unmodified, runs against sunroom when ``E2B_API_URL`` and
``E2B_SANDBOX_URL`` name the server (its root or ``/e2b`` under it) and ``E2B_API_KEY`` is the
server's token. The parts: :mod:`~sunroom.service.e2b.sandboxes` (sandboxes as sunroom
kernels: lifetime, contexts, tokens), :mod:`~sunroom.service.e2b.control` (the REST control
plane), :mod:`~sunroom.service.e2b.interpreter` (``/execute`` streaming, ``/contexts``),
:mod:`~sunroom.service.e2b.envd` (files) and :mod:`~sunroom.service.e2b.facade` (routing and
credentials). :class:`E2BRoutes` is the middleware that hands the facade its requests.
"""

from __future__ import annotations

from typing import final

from starlette.types import ASGIApp, Receive, Scope, Send

from sunroom.service.e2b.facade import E2BFacade
from sunroom.service.e2b.sandboxes import Sandboxes

__all__ = ["E2BFacade", "E2BRoutes", "Sandboxes"]


@final
class E2BRoutes:
    """ASGI middleware: hands the facade the requests it claims, the rest to *app*.

    The facade checks their credentials itself (:meth:`E2BFacade.claims`).
    """

    def __init__(self, app: ASGIApp, *, facade: E2BFacade) -> None:
        self.app = app
        self.facade = facade

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Dispatch one request."""
        if scope["type"] == "http" and self.facade.claims(scope):
            await self.facade(scope, receive, send)
        else:
            await self.app(scope, receive, send)
