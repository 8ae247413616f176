"""The E2B facade as one ASGI app: :class:`E2BFacade`, and which requests are its.

``sunroom serve`` answers E2B's SDK at its root and under ``/e2b``: a user sets
``E2B_API_URL`` and ``E2B_SANDBOX_URL`` to the server's URL (or that URL + ``/e2b``) and
``E2B_API_KEY`` to the server's token. :meth:`E2BFacade.claims` says which requests are the
facade's: every path under ``/e2b``, the control plane's paths (``/sandboxes``,
``/v2/sandboxes`` ...), and any request with the SDK's ``E2b-Sandbox-Id`` header (what it sends
to a sandbox: ``/execute``, ``/contexts``, ``/files``, ``/filesystem.Filesystem/...``,
``/health``). ``E2b-Sandbox-Port`` picks the sandbox-side server: 49999 (code interpreter,
:mod:`sunroom.service.e2b.interpreter`) or any other (envd, :mod:`sunroom.service.e2b.envd`).

Credentials: the control plane needs the server's token as ``X-API-KEY`` (the SDK's header) or
``Authorization: Bearer``. A sandbox route needs that sandbox's own token (``X-Access-Token``:
its envd token; ``E2B-Traffic-Access-Token``: its traffic token) or the server's token; the
comparisons are constant-time. An unknown or killed sandbox answers 502 "The sandbox ... was
not found", as E2B's proxy does (the SDK reads it as "not running").

Limits: a control-plane or code-interpreter body holds at most ``config.max_body_bytes``, an
envd upload ``config.max_file_bytes`` (413 beyond).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

import pydantic
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sunroom.errors import SunroomError
from sunroom.service.config import ServiceConfig
from sunroom.service.e2b.control import control_routes
from sunroom.service.e2b.envd import EnvdTarget, envd_routes
from sunroom.service.e2b.interpreter import interpreter_routes
from sunroom.service.e2b.sandboxes import Sandbox, Sandboxes
from sunroom.service.limits import BodyLimit
from sunroom.service.problems import (
    NotFoundError,
    Unauthorized,
    public_message,
    status_for,
    validation_message,
)

__all__ = ["CONTROL_PREFIXES", "INTERPRETER_PORT", "PREFIX", "E2BFacade"]

log = logging.getLogger("sunroom.service")

PREFIX: Final = "/e2b"
"""The facade's own mount point (it also answers at the server's root)."""

CONTROL_PREFIXES: Final = (
    "/sandboxes",
    "/v2/sandboxes",
    "/templates",
    "/v2/templates",
    "/v3/templates",
    "/snapshots",
    "/volumes",
    "/secrets",
)
"""Root paths that are E2B's control plane (none is a sunroom route)."""

INTERPRETER_PORT: Final = "49999"
"""The ``E2b-Sandbox-Port`` of E2B's code-interpreter server."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def _is_control(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in CONTROL_PREFIXES)


@final
class E2BFacade:
    """The facade's ASGI app over one server's :class:`Sandboxes`."""

    def __init__(self, config: ServiceConfig, sandboxes: Sandboxes) -> None:
        if not config.token:
            raise ValueError("the E2B facade needs the server's token")
        self.sandboxes = sandboxes
        self._token = config.token.encode()
        control = Starlette(
            routes=control_routes(sandboxes), exception_handlers=_handlers(_json_error)
        )
        interpreter = Starlette(
            routes=interpreter_routes(sandboxes, self.sandbox),
            exception_handlers=_handlers(_text_error),
        )
        envd = Starlette(routes=envd_routes(self.target, max_file_bytes=config.max_file_bytes))
        self._control: ASGIApp = BodyLimit(control, max_bytes=config.max_body_bytes)
        self._interpreter: ASGIApp = BodyLimit(interpreter, max_bytes=config.max_body_bytes)
        self._envd: ASGIApp = BodyLimit(envd, max_bytes=config.max_file_bytes + (1 << 20))

    @staticmethod
    def claims(scope: Scope) -> bool:
        """Whether an HTTP request (at the server's root) is the facade's."""
        path: str = scope.get("path", "")
        if path == PREFIX or path.startswith(PREFIX + "/"):
            return True
        return _is_control(path) or _header(scope, b"e2b-sandbox-id") is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer a request :meth:`claims` said is the facade's."""
        path: str = scope["path"]
        if path == PREFIX or path.startswith(PREFIX + "/"):
            inner = path[len(PREFIX) :] or "/"
            scope = {**scope, "path": inner, "raw_path": inner.encode()}
            path = inner
        if _is_control(path):
            if not self._server_token(scope):
                refused = _json_error_response(401, "a valid X-API-KEY is required")
                await refused(scope, receive, send)
                return
            await self._control(scope, receive, send)
        elif _header(scope, b"e2b-sandbox-port") == INTERPRETER_PORT.encode():
            await self._interpreter(scope, receive, send)
        else:
            await self._envd(scope, receive, send)

    # -- credentials ------------------------------------------------------------------------

    def _server_token(self, scope: Scope) -> bool:
        key = _header(scope, b"x-api-key") or b""
        bearer = _header(scope, b"authorization") or b""
        return hmac.compare_digest(key, self._token) or hmac.compare_digest(
            bearer, b"Bearer " + self._token
        )

    async def sandbox(self, request: Request) -> Sandbox:
        """The request's sandbox, its credentials checked.

        Raises NotFoundError (unknown or killed: answered 502 "was not found"), Unauthorized.
        """
        sid = request.headers.get("e2b-sandbox-id", "")
        sandbox = self.sandboxes.get(sid)
        access = request.headers.get("x-access-token", "").encode()
        traffic = request.headers.get("e2b-traffic-access-token", "").encode()
        if (
            hmac.compare_digest(access, sandbox.envd_token.encode())
            or hmac.compare_digest(traffic, sandbox.traffic_token.encode())
            or self._server_token(request.scope)
        ):
            return sandbox
        raise Unauthorized("a valid X-Access-Token or E2B-Traffic-Access-Token is required")

    async def target(self, request: Request) -> EnvdTarget:
        """The envd routes' view of the request's sandbox (its default context)."""
        sandbox = await self.sandbox(request)
        return EnvdTarget(
            kernel=sandbox.default.kernel, workdir=sandbox.workdir, sandbox_id=sandbox.sandbox_id
        )


def _status_and_message(request: Request, exc: Exception, *, proxy: bool) -> tuple[int, str]:
    if proxy and isinstance(exc, NotFoundError) and str(exc).startswith("The sandbox "):
        return 502, str(exc)  # E2B's proxy in front of a sandbox: it is gone
    if isinstance(exc, pydantic.ValidationError):
        return 400, validation_message(exc)
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    status = status_for(exc) if isinstance(exc, SunroomError) else 500
    if status == 422:
        status = 400  # E2B answers a bad request 400
    if status >= 500 and status != 501:
        log.error("E2B %s %s failed", request.method, request.url.path, exc_info=exc)
        return status, public_message(exc)
    return status, str(exc)


def _json_error_response(status: int, message: str) -> Response:
    return JSONResponse({"code": status, "message": message}, status_code=status)


async def _json_error(request: Request, exc: Exception) -> Response:
    return _json_error_response(*_status_and_message(request, exc, proxy=False))


async def _text_error(request: Request, exc: Exception) -> Response:
    status, message = _status_and_message(request, exc, proxy=True)
    return PlainTextResponse(message, status_code=status)


Handler = Callable[[Request, Exception], Awaitable[Response]]


def _handlers(handler: Handler) -> dict[Any, Handler]:
    # the specific classes are answered by Starlette's ExceptionMiddleware (no traceback in the
    # log: _status_and_message logs the 5xx ones); Exception by its ServerErrorMiddleware
    return {
        SunroomError: handler,
        pydantic.ValidationError: handler,
        HTTPException: handler,
        Exception: handler,
    }
