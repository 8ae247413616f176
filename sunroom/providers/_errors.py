"""Shared classification of vendor failures into the sunroom error tree.

Each adapter's ``_translate`` pulls the status, body and headers out of its SDK's
exception and calls :func:`from_status`; transport failures go to :func:`timeout` and
:func:`connection`.
"""

from __future__ import annotations

import email.utils
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from sunroom.errors import (
    AuthenticationError,
    BadRequestError,
    ContextTooLongError,
    OverloadedError,
    ProviderConnectionError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitedError,
)

_CONTEXT_TOO_LONG = re.compile(
    r"prompt is too long|context[_ ]length|context window|maximum context"
    r"|exceeds the maximum number of tokens|input token count .* exceeds",
    re.IGNORECASE,
)

# Vendor error "type"/"status" strings that decide the class when there is no error status:
# errors sent inside a 200 event stream (Anthropic, OpenAI) or in a failed response object.
_BY_KIND: dict[str, type[ProviderError]] = {
    "overloaded_error": OverloadedError,
    "api_error": OverloadedError,
    "server_error": OverloadedError,
    "rate_limit_error": RateLimitedError,
    "authentication_error": AuthenticationError,
    "permission_error": AuthenticationError,
    "invalid_request_error": BadRequestError,
    "not_found_error": BadRequestError,
    "request_too_large": BadRequestError,
    "timeout_error": ProviderTimeoutError,
    "rate_limit_exceeded": RateLimitedError,
    "RESOURCE_EXHAUSTED": RateLimitedError,
    "UNAVAILABLE": OverloadedError,
    "INTERNAL": OverloadedError,
    "DEADLINE_EXCEEDED": ProviderTimeoutError,
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": AuthenticationError,
    "INVALID_ARGUMENT": BadRequestError,
    "FAILED_PRECONDITION": BadRequestError,
    "NOT_FOUND": BadRequestError,
}


def _by_status(status: int) -> type[ProviderError]:
    if status in (401, 403):
        return AuthenticationError
    if status == 429:
        return RateLimitedError
    if status == 408:
        return ProviderTimeoutError
    if status == 409 or status >= 500:
        return OverloadedError
    if 400 <= status < 500:
        return BadRequestError
    return ProviderError


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Read ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date) from headers."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(float(value) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def from_status(
    provider: str,
    status: int | None,
    message: str,
    *,
    body: object = None,
    kind: str | None = None,
    code: str | None = None,
    retry_after: float | None = None,
) -> ProviderError:
    """Build the sunroom error for a vendor's error reply.

    The HTTP ``status`` decides the class when it is an error status; otherwise ``kind``,
    the vendor's error type or status string, does. ``code`` (the vendor's finer error code)
    and the message refine bad requests into context-too-long.
    """
    cls: type[ProviderError] | None = None
    if status is not None and status >= 400:
        cls = _by_status(status)  # the HTTP status decides when there is one
    elif kind:
        cls = _BY_KIND.get(kind)  # errors inside a 200 stream: the vendor's type decides
    if cls is None:
        cls = ProviderError
    if code == "insufficient_quota":
        cls = ProviderError  # out of credit: retrying will not help
    if cls is BadRequestError and (
        code == "context_length_exceeded" or _CONTEXT_TOO_LONG.search(message)
    ):
        cls = ContextTooLongError
    label = " ".join(str(x) for x in (status, kind) if x)
    text = f"{provider}: {label}: {message}" if label else f"{provider}: {message}"
    if cls is RateLimitedError:
        return RateLimitedError(
            text, provider=provider, status_code=status, body=body, retry_after=retry_after
        )
    return cls(text, provider=provider, status_code=status, body=body)


def timeout(provider: str, detail: str = "") -> ProviderTimeoutError:
    """The vendor did not answer in time."""
    suffix = f" ({detail})" if detail else ""
    return ProviderTimeoutError(
        f"{provider}: no reply within the timeout{suffix}", provider=provider
    )


def connection(provider: str, detail: str) -> ProviderConnectionError:
    """The endpoint was unreachable or the connection broke mid-reply."""
    return ProviderConnectionError(f"{provider}: connection failed: {detail}", provider=provider)


def nested(body: object, *keys: str) -> Any:  # a JSON value of any type; callers narrow it
    """``body[k1][k2]...`` for JSON-ish dicts, or ``None`` when any step is missing."""
    for key in keys:
        if not isinstance(body, dict):
            return None
        body = body.get(key)
    return body


def from_transport(provider: str, exc: BaseException) -> ProviderError | None:
    """Map an ``httpx``/``httpx2`` transport exception (timeout, broken connection)."""
    for module_name in ("httpx2", "httpx"):
        module = sys.modules.get(module_name)
        if module is None:
            continue
        if isinstance(exc, module.TimeoutException):
            return timeout(provider, type(exc).__name__)
        if isinstance(exc, module.TransportError | module.StreamError):
            return connection(provider, f"{type(exc).__name__}: {exc}")
    return None
