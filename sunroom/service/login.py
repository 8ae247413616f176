"""The web view's login: a bearer token exchanged once for a signed session cookie.

The page never holds the token: its login form posts it to ``POST /ui/login``, which answers
with a cookie (:data:`COOKIE`) that is ``HttpOnly`` (no script reads it), ``SameSite=Strict``
(no other site's page sends it), ``Path=/`` and ``Secure`` when the request came over HTTPS.
The cookie is ``v1.<expiry>.<nonce>.<mac>``: an HMAC-SHA256 under a key derived from the
server's token, so every replica sharing the token accepts it without shared state, and a new
token ends every cookie at once. There is no server-side session to revoke: logging out drops
the cookie from the browser; rotate the token to end the others.

A request authenticated by the cookie and not ``GET``/``HEAD`` must also carry
:data:`CSRF_HEADER` (which a cross-site form cannot send, and a cross-site script cannot send
without a CORS preflight this server never grants) and, when it has an ``Origin``, the same
origin as its ``Host``. :class:`LoginThrottle` bounds wrong tokens per client address.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections import deque
from collections.abc import Iterable
from typing import Final, final
from urllib.parse import urlsplit

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "CookieSigner",
    "LoginThrottle",
    "cookie_value",
    "same_origin",
]

COOKIE: Final = "sunroom_ui"
"""The session cookie's name."""

CSRF_HEADER: Final = b"x-sunroom-csrf"
"""The header every cookie-authenticated request other than GET/HEAD must carry (value 1)."""

_CONTEXT: Final = b"sunroom web view session cookie v1"


@final
class CookieSigner:
    """Issues and checks session cookies under a key derived from the server's *token*.

    Args:
        token: the server's bearer token (the cookie's MAC key is derived from it).
        lifetime_s: how long a cookie is accepted after it was issued.
    """

    def __init__(self, token: str, *, lifetime_s: float) -> None:
        if not token:
            raise ValueError("CookieSigner needs the server's token")
        if lifetime_s <= 0:
            raise ValueError("the cookie lifetime must be positive")
        self._key = hmac.new(token.encode(), _CONTEXT, hashlib.sha256).digest()
        self._token = token.encode()
        self.lifetime_s = lifetime_s

    def matches_token(self, given: str) -> bool:
        """Whether *given* is the server's token (constant-time)."""
        return hmac.compare_digest(given.encode(), self._token)

    def issue(self, *, now: float | None = None) -> str:
        """A new cookie value, valid for ``lifetime_s`` from *now*."""
        expiry = int((time.time() if now is None else now) + self.lifetime_s)
        body = f"v1.{expiry}.{secrets.token_hex(16)}"
        return f"{body}.{self._mac(body)}"

    def valid(self, value: str, *, now: float | None = None) -> bool:
        """Whether *value* is a cookie this signer issued that has not expired."""
        version, _, rest = value.partition(".")
        expiry, _, rest = rest.partition(".")
        nonce, _, mac = rest.partition(".")
        if version != "v1" or not expiry.isdigit() or not nonce or not mac:
            return False
        if not hmac.compare_digest(mac, self._mac(f"v1.{expiry}.{nonce}")):
            return False
        return int(expiry) > (time.time() if now is None else now)

    def _mac(self, body: str) -> str:
        digest = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def cookie_value(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The session cookie's value in an ASGI scope's raw *headers*, or None."""
    for name, value in headers:
        if name != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            key, _, val = part.strip().partition("=")
            if key == COOKIE:
                return val
    return None


def same_origin(origin: str, host: str, scheme: str) -> bool:
    """Whether an ``Origin`` header names this server (*scheme* and *host* as requested).

    ``null`` (a sandboxed frame, a data: URL) is never the same origin.
    """
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    default = {"http": ":80", "https": ":443"}

    def normal(netloc: str, scheme: str) -> str:
        netloc = netloc.lower()
        suffix = default[scheme]
        return netloc[: -len(suffix)] if netloc.endswith(suffix) else netloc

    if scheme not in default:
        return False
    return parts.scheme == scheme and normal(parts.netloc, parts.scheme) == normal(host, scheme)


@final
class LoginThrottle:
    """At most *max_failures* wrong tokens per client address within *window_s*.

    Past that the client's logins are refused (429) until the oldest failure leaves the
    window; a right token does not reset the count. At most 4,096 addresses are remembered
    (the oldest is forgotten first).
    """

    def __init__(self, *, max_failures: int = 10, window_s: float = 60.0) -> None:
        self._max = max_failures
        self._window = window_s
        self._failures: dict[str, deque[float]] = {}

    def retry_after(self, client: str, *, now: float | None = None) -> float | None:
        """Seconds until *client* may try again, or None when it may now."""
        at = time.monotonic() if now is None else now
        recent = self._failures.get(client)
        if recent is None:
            return None
        while recent and recent[0] <= at - self._window:
            recent.popleft()
        if len(recent) < self._max:
            return None
        return max(recent[0] + self._window - at, 0.001)

    def failed(self, client: str, *, now: float | None = None) -> None:
        """Count one wrong token from *client*."""
        at = time.monotonic() if now is None else now
        if client not in self._failures and len(self._failures) >= 4096:
            self._failures.pop(next(iter(self._failures)))
        self._failures.setdefault(client, deque()).append(at)
