"""Bearer-token authentication: :class:`BearerAuth`, an ASGI middleware.

Every HTTP request but the open paths (``/healthz``) must carry ``Authorization: Bearer
<token>``; the comparison is constant-time (:func:`hmac.compare_digest`). A token in the query
string is never looked at. A request without the right token gets 401 with a JSON error and
``WWW-Authenticate: Bearer``.

With a :class:`~sunroom.service.login.CookieSigner`, the web view's session cookie is accepted
too (:mod:`sunroom.service.login`); a cookie-authenticated request that is not ``GET``/``HEAD``
must carry ``X-Sunroom-CSRF: 1`` and, when it names one, this server's ``Origin``, or it gets
403 ``CsrfRefused``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Collection
from typing import final

from starlette.types import ASGIApp, Receive, Scope, Send

from sunroom.service.login import CSRF_HEADER, CookieSigner, cookie_value, same_origin
from sunroom.service.problems import error_body

__all__ = ["BearerAuth", "HostCheck", "send_json"]


async def send_json(
    send: Send, status: int, body: object, *, headers: Collection[tuple[bytes, bytes]] = ()
) -> None:
    """Send a whole JSON response through raw ASGI."""
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


@final
class BearerAuth:
    """Refuses HTTP requests without the bearer *token*, except on *open_paths*."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str,
        open_paths: Collection[str] = ("/healthz",),
        open_prefixes: Collection[str] = (),
        cookies: CookieSigner | None = None,
    ) -> None:
        if not token:
            raise ValueError("BearerAuth needs a token")
        self.app = app
        self._expected = f"Bearer {token}".encode()
        self._open = frozenset(open_paths)
        self._open_prefixes = tuple(open_prefixes)
        self._cookies = cookies

    def allowed(self, scope: Scope) -> bool:
        """Whether the request carries the token (constant-time compare)."""
        given = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                given = value
                break
        return hmac.compare_digest(given, self._expected)

    def _cookie(self, scope: Scope) -> bool:
        """Whether the request carries a valid session cookie of the web view."""
        if self._cookies is None:
            return False
        value = cookie_value(scope.get("headers", ()))
        return value is not None and self._cookies.valid(value)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass authorised (and open) requests on; answer the others 401 (or 403, CSRF)."""
        path = scope.get("path", "")
        if (
            scope["type"] != "http"
            or path in self._open
            or path.startswith(self._open_prefixes)
            or self.allowed(scope)
        ):
            await self.app(scope, receive, send)
            return
        if self._cookie(scope):
            if scope["method"] in ("GET", "HEAD") or _csrf_safe(scope):
                await self.app(scope, receive, send)
                return
            message = (
                "a request of the web view must come from its own page (the X-Sunroom-CSRF "
                "header and a same-origin Origin)"
            )
            await send_json(send, 403, error_body("CsrfRefused", message))
            return
        await send_json(
            send,
            401,
            error_body(
                "Unauthorized", "a valid 'Authorization: Bearer <token>' header is required"
            ),
            headers=[(b"www-authenticate", b"Bearer")],
        )


def _csrf_safe(scope: Scope) -> bool:
    """Whether a cookie-authenticated request carries the CSRF header and no foreign Origin."""
    csrf = origin = host = None
    for name, value in scope.get("headers", ()):
        if name == CSRF_HEADER:
            csrf = value
        elif name == b"origin":
            origin = value.decode("latin-1")
        elif name == b"host":
            host = value.decode("latin-1")
    if csrf != b"1":
        return False
    if origin is None:
        return True
    return host is not None and same_origin(origin, host, scope.get("scheme", "http"))


@final
class HostCheck:
    """Refuses HTTP requests whose ``Host`` header *allowed* rejects (400), on every path.

    A loopback service is reachable from a browser through DNS rebinding (``evil.example``
    resolving to 127.0.0.1); the browser still sends ``Host: evil.example``.
    """

    def __init__(self, app: ASGIApp, *, allowed: Callable[[str], bool]) -> None:
        self.app = app
        self._allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass requests with an allowed (or no) Host header on; answer the others 400."""
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == b"host" and not self._allowed(value.decode("latin-1")):
                    message = "the Host header names a host this server does not serve"
                    await send_json(send, 400, error_body("HostNotAllowed", message))
                    return
        await self.app(scope, receive, send)
