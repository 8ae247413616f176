"""HTTP errors: the service's own exceptions and how every sunroom error maps to a status.

Every error response is JSON ``{"error": {"type": ..., "message": ...}}``; ``type`` is the
exception's class name. :func:`status_for` walks the error tree: the most specific mapping wins.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Final, final

import pydantic

from sunroom.errors import (
    AuthenticationError,
    ClosedError,
    ForkError,
    HostFunctionError,
    KernelError,
    KernelStartError,
    McpServerError,
    ProtocolError,
    ProviderError,
    SandboxUnavailableError,
    SunroomError,
    UsageError,
)
from sunroom.store import StoreConflictError, StoreError, StoreNotFoundError

__all__ = [
    "CapacityError",
    "ConflictError",
    "KernelLost",
    "NotFoundError",
    "OwnedElsewhereError",
    "ShuttingDown",
    "Unauthorized",
    "Unsupported",
    "error_body",
    "public_message",
    "retry_after",
    "status_for",
    "validation_message",
]


@final
class NotFoundError(UsageError):
    """No such session or kernel (404)."""


@final
class Unsupported(UsageError):
    """A route of a foreign API (the E2B facade) that sunroom does not cover (501)."""


@final
class Unauthorized(UsageError):
    """A request without the credential its route needs (401); the message never echoes it."""


@final
class ConflictError(UsageError):
    """The resource is not in a state that allows the request (409)."""


@final
class KernelLost(SunroomError):
    """The raw kernel lived on a replica that is gone (409): its state is lost.

    It is never silently replaced by a fresh kernel (code would then fail with a ``NameError``
    and no signal): every request to it answers this until the caller deletes it and creates
    a new one.
    """

    code: Final = "kernel_lost"


@final
class CapacityError(SunroomError):
    """The server runs as many sessions or kernels as it may (429, ``Retry-After: 1``)."""


@final
class OwnedElsewhereError(SunroomError):
    """Another live server holds the session's lease (503 with ``Retry-After``).

    A client can act on it: retry after ``retry_after_s`` seconds, when the lease has either
    been renewed (still elsewhere: ask that server) or run out (this server resumes it).
    """

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@final
class ShuttingDown(SunroomError):
    """The server is stopping (SIGTERM/SIGINT): the request was not done, or was cut off (503).

    An expected end, not a failure: answered without a traceback in the log.
    """


_STATUS: Final[tuple[tuple[type[BaseException], int], ...]] = (
    (NotFoundError, 404),
    (Unsupported, 501),
    (Unauthorized, 401),
    (StoreNotFoundError, 404),
    (ConflictError, 409),
    (KernelLost, 409),
    (ClosedError, 409),
    (ForkError, 409),
    (StoreConflictError, 409),
    (CapacityError, 429),
    (OwnedElsewhereError, 503),
    (ShuttingDown, 503),
    (pydantic.ValidationError, 422),
    (UsageError, 422),
    (SandboxUnavailableError, 503),
    (KernelStartError, 503),
    (McpServerError, 503),  # a configured MCP server did not start
    (KernelError, 500),
    (ProtocolError, 500),
    (HostFunctionError, 500),
    (AuthenticationError, 502),
    (ProviderError, 502),
    (StoreError, 503),
    (SunroomError, 500),
)


def retry_after(exc: BaseException) -> int | None:
    """Seconds a client should wait before retrying, for the ``Retry-After`` header."""
    if isinstance(exc, OwnedElsewhereError):
        return max(1, math.ceil(exc.retry_after_s))
    if isinstance(exc, CapacityError):
        return 1
    return None


def status_for(exc: BaseException) -> int:
    """The HTTP status of *exc* (500 for anything unknown)."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(type_: str, message: str, *, code: str | None = None) -> dict[str, dict[str, str]]:
    """The JSON error envelope (with a stable ``code`` for errors a client branches on)."""
    body = {"type": type_, "message": message}
    if code is not None:
        body["code"] = code
    return {"error": body}


_PATH: Final = re.compile(r"(?<![\w.#~:/])(?:~|/)(?:[^\s/'\"(),:;]+/)*[^\s/'\"(),:;]+")


def public_message(exc: BaseException) -> str:
    """What a client may see of a server-side (5xx) error: its first line, no host paths.

    A kernel that failed to start reports its traceback and the paths of the host; those stay
    in the server log (every 5xx is logged with its traceback).
    """
    text = str(exc).split("Traceback (most recent call last)", 1)[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = _PATH.sub("<path>", lines[0]) if lines else ""
    return (
        first.rstrip(" :") or f"the server failed ({type(exc).__name__}); its log has the details"
    )


_OBJECT_TYPES: Final = frozenset({"model_type", "model_attributes_type", "dict_type"})


def validation_message(exc: pydantic.ValidationError, *, field: Callable[[str], str] = str) -> str:
    """*exc* as one line: each error's field and pydantic's message, ``;``-separated.

    Never the input that failed (it may be a secret), never the name of the model class.
    *field* renames a top-level field (the CLI shows ``max_turns`` as ``--max-turns``).
    """
    parts = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if error["type"] in _OBJECT_TYPES:
            message = "Input should be an object"
        loc = [str(p) for p in error["loc"]]
        where = ".".join([field(loc[0]), *loc[1:]]) if loc else ""
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid input"
