"""The service's error answers as sunroom's exceptions: :func:`error_from`.

The service answers every error with ``{"error": {"type", "message"}}`` (its status from
:func:`sunroom.service.problems.status_for`); ``type`` is the class name of the exception it
raised. The client raises that class again where it knows it (:data:`CLASSES`), with the
service's one-sentence message; a type it does not know maps by status (404 NotFoundError, 409
ConflictError, 429 CapacityError, another 4xx UsageError, 5xx ServiceError). An answer that is
not that JSON is a :class:`~sunroom.errors.ServiceError` naming the status.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Final

from sunroom.errors import (
    AgentError,
    AuthenticationError,
    BadRequestError,
    ClosedError,
    FileError,
    ForkError,
    HostFunctionError,
    KernelDiedError,
    KernelError,
    KernelStartError,
    McpServerError,
    PackageInstallError,
    ProtocolError,
    ProviderError,
    SandboxUnavailableError,
    ServiceError,
    StoreError,
    StoreNotFoundError,
    StoreVersionError,
    SunroomError,
    UsageError,
)
from sunroom.service.problems import (
    CapacityError,
    ConflictError,
    KernelLost,
    NotFoundError,
    OwnedElsewhereError,
    ShuttingDown,
)

__all__ = ["CLASSES", "KernelLost", "error_from"]

CLASSES: Final[Mapping[str, Callable[[str], SunroomError]]] = {
    "UsageError": UsageError,
    "ClosedError": ClosedError,
    "ValidationError": UsageError,  # pydantic's, of the request body
    "HTTPException": UsageError,
    "BodyTooLarge": UsageError,
    "InvalidGlob": UsageError,
    "HostNotAllowed": UsageError,
    "Unauthorized": UsageError,  # the token is wrong: the caller must act
    "NotFoundError": NotFoundError,
    "ConflictError": ConflictError,
    "CapacityError": CapacityError,
    "KernelLost": KernelLost,
    "ShuttingDown": ShuttingDown,
    "KernelError": KernelError,
    "KernelStartError": KernelStartError,
    "KernelDiedError": KernelDiedError,
    "ForkError": ForkError,
    "SandboxUnavailableError": SandboxUnavailableError,
    "PackageInstallError": PackageInstallError,
    "ProtocolError": ProtocolError,
    "HostFunctionError": HostFunctionError,
    "McpServerError": McpServerError,
    "ProviderError": ProviderError,
    "AuthenticationError": AuthenticationError,
    "BadRequestError": BadRequestError,
    "AgentError": AgentError,
    "StoreError": StoreError,
    "StoreNotFoundError": StoreNotFoundError,
    "StoreVersionError": StoreVersionError,
}
"""The error types the service names, and the class each is raised as on the client."""

_FILE_REASONS: Final = {404: "not_found", 409: "is_dir", 507: "no_space"}
"""A FileError's reason from its status (a 409 is ``is_dir`` or ``not_dir``)."""


def _by_status(status: int, message: str) -> SunroomError:
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return ConflictError(message)
    if status == 429:
        return CapacityError(message)
    if 400 <= status < 500:
        return UsageError(message)
    return ServiceError(message, status=status)


def error_from(status: int, body: bytes, *, retry_after: str | None = None) -> SunroomError:
    """The exception for an error answer of *status* with *body* (and ``Retry-After``)."""
    try:
        problem = json.loads(body)["error"]
        kind, message = str(problem["type"]), str(problem["message"])
    except (ValueError, KeyError, TypeError):
        return ServiceError(f"the service answered {status} without its error JSON", status=status)
    if kind == "FileError":
        return FileError(message, reason=_FILE_REASONS.get(status, "refused"))
    if kind == "OwnedElsewhereError":
        wait = float(retry_after) if retry_after and retry_after.isdigit() else 1.0
        return OwnedElsewhereError(message, retry_after_s=wait)
    if kind == "InternalError":
        return ServiceError(message, status=status)
    make = CLASSES.get(kind)
    return make(message) if make is not None else _by_status(status, message)
