"""Request size limits: :class:`BodyLimit`, an ASGI middleware, and :class:`BodyTooLarge`.

A declared ``Content-Length`` over the limit is refused (413) before the body is read; a body
without one (chunked) is counted while it is read, and reading raises :class:`BodyTooLarge`
(turned into 413 by the app) as soon as it passes the limit: it is never buffered whole first.
"""

from __future__ import annotations

import re
from typing import Final, final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sunroom.errors import UsageError
from sunroom.service.auth import send_json
from sunroom.service.problems import error_body

__all__ = ["FILE_UPLOAD", "BodyLimit", "BodyTooLarge", "HeaderLimit"]

FILE_UPLOAD: Final = re.compile(r"/(?:kernels|sessions)/[^/]+/files/.+")
"""The path of a file upload (``PUT``), whose body has a limit of its own."""


@final
class BodyTooLarge(UsageError):
    """The request body is larger than the server accepts (413)."""


@final
class BodyLimit:
    """Refuses request bodies over *max_bytes* (see the module docstring).

    A file upload (``PUT`` on a :data:`FILE_UPLOAD` path) has *file_max_bytes* instead, when
    given.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int, file_max_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.file_max_bytes = file_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a declared oversize body; count an undeclared one while it is read."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        if (
            self.file_max_bytes is not None
            and scope.get("method") == "PUT"
            and FILE_UPLOAD.fullmatch(scope.get("path", ""))
        ):
            limit = self.file_max_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared < 0 or declared > limit:
                    status = 413 if declared > limit else 400
                    message = (
                        f"the request body is over the limit of {limit} bytes"
                        if status == 413
                        else "invalid Content-Length"
                    )
                    kind = "BodyTooLarge" if status == 413 else "BadRequest"
                    await send_json(send, status, error_body(kind, message))
                    return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(f"the request body is over the limit of {limit} bytes")
            return message

        await self.app(scope, counted, send)


@final
class HeaderLimit:
    """Refuses requests whose head (target and headers) is over *max_bytes* (431).

    The HTTP layer refuses a head that is still incomplete past the limit; this catches one
    that arrived whole in a single read.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 431 for an oversize head; pass the others on."""
        if scope["type"] == "http":
            size = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b""))
            size += sum(len(n) + len(v) + 4 for n, v in scope.get("headers", ()))
            if size > self.max_bytes:
                message = f"the request headers are over the limit of {self.max_bytes} bytes"
                await send_json(send, 431, error_body("HeadersTooLarge", message))
                return
        await self.app(scope, receive, send)
