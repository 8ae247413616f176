"""Sending a request on to the replica it belongs to: :class:`Forwarding`, an ASGI middleware.

Any replica accepts any request. Reads of a session (its record, events, SSE, result) are
served from the store by whichever replica gets them. A request that needs the process running
a session or a raw kernel (a message, an approval, a file, a kernel call) is *forwarded*: this
replica opens a connection to the holder's internal URL (``advertise_url``), sends the request
on with its body streamed, and streams the answer back. New sessions and kernels go to the
replica placement picks (:meth:`~sunroom.service.cluster.Cluster.place`).

Forwarded, not redirected: a redirect would need every client to reach every replica's
internal address (pod IPs are not reachable from outside a cluster) and to follow a 307 with
its body, which SDKs and browsers do inconsistently. A forwarded request carries the
``X-Sunroom-Forwarded`` header and is never forwarded again: a replica that gets one serves it
itself, so two replicas with different views of the store cannot bounce a request forever.

The middleware runs after the bearer check, so only an authenticated request is ever sent on,
with its own ``Authorization`` (every replica of a cluster has the same token), and after the
body cap, so a forwarded body is bounded too. A holder that cannot be reached (it died, its
record has not lapsed yet) answers 503 with ``Retry-After``: once its leases lapse, another
replica resumes its sessions, and its raw kernels answer ``kernel_lost``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, final

import aiohttp
from multidict import CIMultiDict
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sunroom.service.auth import send_json
from sunroom.service.problems import error_body

__all__ = ["FORWARDED", "ErrorAnswer", "Forwarding", "Router", "Target", "target_of"]

log = logging.getLogger("sunroom.service")

FORWARDED: Final = "x-sunroom-forwarded"
"""The header a forwarded request carries (the id of the replica that sent it on)."""

_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_FORWARDED: Final = FORWARDED.encode()
_NO_AUTO: Final = frozenset({"User-Agent", "Accept-Encoding", "Content-Type"})
"""Headers the client library must not add: the request goes on as the client sent it."""
_SESSION: Final = re.compile(r"^/sessions/(?P<id>[^/]+)(?P<rest>/.*)?$")
_KERNEL: Final = re.compile(r"^/kernels/(?P<id>[^/]+)(?P<rest>/.*)?$")


@final
@dataclass(frozen=True, slots=True)
class Target:
    """What a request needs: the holder of a session or kernel, or a place for new work."""

    kind: Literal["session", "kernel", "new"]
    id: str = ""
    method: str = "GET"


def target_of(method: str, path: str) -> Target | None:
    """The :class:`Target` of a request, or None when any replica serves it from the store.

    Session writes and the routes that need its running kernel (messages, approvals, files,
    delete) belong to its holder; every route of a raw kernel to its holder; creating a session
    or kernel is placed.
    """
    if method == "POST" and path in ("/sessions", "/kernels"):
        return Target("new", method=method)
    if m := _SESSION.match(path):
        rest = m["rest"] or ""
        if (
            (rest == "" and method == "DELETE")
            or rest == "/messages"
            or rest.startswith("/approvals")
            or rest.startswith("/files")
        ):
            return Target("session", m["id"], method)
        return None
    if m := _KERNEL.match(path):
        return Target("kernel", m["id"], method)
    return None


ErrorAnswer: TypeAlias = tuple[int, Mapping[str, object], list[tuple[bytes, bytes]]]
"""An error answer: status, JSON body, extra headers."""

Router: TypeAlias = Callable[[Target], Awaitable[str | None]]
"""``await route(target)``: the base URL of the replica to send the request to, or None."""


@final
class Forwarding:
    """Send each request that belongs elsewhere on to its replica (see the module).

    Args:
        app: the application that serves what stays here.
        route: where a target belongs (the service's; may raise a SunroomError, answered as
            the app answers it: ``kernel_lost``, 429).
        client: the connection pool to the other replicas (the service's; None while no
            cluster is running, and then everything is served here).
        replica_id: this replica's id, sent in ``X-Sunroom-Forwarded``.
        answer_error: turns an exception from *route* into the app's JSON error answer
            (status, body, headers).
        unreachable: told the URL of a replica that could not be reached (the router drops
            what it remembers of it).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        route: Callable[[], Router | None],
        client: Callable[[], aiohttp.ClientSession | None],
        replica_id: Callable[[], str],
        answer_error: Callable[[BaseException], ErrorAnswer],
        unreachable: Callable[[str], None] = lambda url: None,
    ) -> None:
        self.app = app
        self._forget = unreachable
        self._route = route
        self._client = client
        self._replica_id = replica_id
        self._answer_error = answer_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve here, or forward (see the module)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route, client = self._route(), self._client()
        target = None if route is None else target_of(scope["method"], scope["path"])
        if (
            route is None  # no cluster: every request is served here, at no cost
            or client is None
            or target is None
            or any(name == _FORWARDED for name, _ in scope["headers"])
        ):
            await self.app(scope, receive, send)
            return
        try:
            url = await route(target)
        except Exception as exc:  # a SunroomError the app would answer: kernel_lost, 429
            status, body, extra = self._answer_error(exc)
            await send_json(send, status, body, headers=extra)
            return
        if url is None:
            await self.app(scope, receive, send)
            return
        await self._forward(client, url, scope, receive, send)

    async def _forward(
        self, client: aiohttp.ClientSession, url: str, scope: Scope, receive: Receive, send: Send
    ) -> None:
        query = scope.get("query_string", b"")
        target = url.rstrip("/") + scope["path"] + (f"?{query.decode('latin-1')}" if query else "")
        headers = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.lower() not in _HOP
        )
        headers[FORWARDED] = self._replica_id()
        sized = "content-length" in headers
        body = _body(receive) if sized or scope["method"] not in ("GET", "HEAD") else None
        try:
            async with client.request(
                scope["method"],
                target,
                headers=headers,
                data=body,
                allow_redirects=False,
                skip_auto_headers=_NO_AUTO,
            ) as response:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status,
                        "headers": [
                            (k, v) for k, v in response.raw_headers if k.lower() not in _HOP
                        ],
                    }
                )
                async for chunk in response.content.iter_any():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (aiohttp.ClientConnectorError, TimeoutError) as exc:  # it never got the request
            log.warning("forwarding %s %s to %s failed: %s: %s", scope["method"],
                        scope["path"], url, type(exc).__name__, exc)  # fmt: skip
            self._forget(url)
            message = (
                "the server that holds this session or kernel cannot be reached; retry "
                "shortly (once its lease runs out, another server takes its sessions over)"
            )
            await send_json(
                send, 503, error_body("Unreachable", message), headers=[(b"retry-after", b"2")]
            )
        except aiohttp.ClientError as exc:  # it failed while answering: so do we
            log.warning("the answer forwarded from %s failed: %s: %s", url,
                        type(exc).__name__, exc)  # fmt: skip
            self._forget(url)
            with contextlib.suppress(Exception):  # a start already sent: the answer is cut off
                message = (
                    "the server that holds this session or kernel failed while answering; the "
                    "request may have been done"
                )
                await send_json(send, 502, error_body("Unreachable", message))


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    """The request's body as it arrives (stops at the client's disconnect)."""
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return
