"""The one error tree of sunroom, sorted by who must act.

Every exception sunroom raises on the host is a :class:`SunroomError`. Foreign exceptions
(OS errors, SDK errors, pydantic errors) are translated at one boundary per component, so a
caller can catch by *who must act*::

    SunroomError
    ├── UsageError                  the caller misused the API (fix the calling code)
    │   ├── ClosedError             the kernel/model/session was already closed
    │   ├── FileError               a workdir file operation was refused or failed (``reason``)
    │   └── ApprovalNotPending      no approval request of that id waits (unknown or answered)
    ├── KernelError                 the kernel failed; it is (or will be) restarted
    │   ├── KernelStartError        the kernel could not be started
    │   ├── KernelDiedError         the kernel process died (exit code / signal / OOM)
    │   └── SandboxUnavailableError the backend cannot provide its boundary (fail closed)
    ├── PackageInstallError         install() failed (pip's reason); the site dir is unchanged
    ├── ProtocolError               the wire was violated; the channel is closed, kernel killed
    ├── HostFunctionError           a host function could not be called as asked
    │   ├── HostFunctionNotFound    no such function is registered
    │   ├── HostFunctionArgumentError  arguments failed validation (per-field message)
    │   ├── HostFunctionTimeout     the function ran past its timeout
    │   ├── HostFunctionBusy        the concurrency limit was reached and the wait timed out
    │   ├── HostFunctionBudgetExceeded  the per-kernel call budget is spent
    │   ├── McpServerError          an MCP server could not be reached or exited mid-call
    │   ├── McpToolError            an MCP tool reported an error (the server's message)
    │   └── ApprovalDenied          the approval policy or a person refused the call
    ├── ProviderError               a model provider failed (the operator or vendor must act)
    │   ├── AuthenticationError     bad or missing API key (401/403)
    │   ├── RateLimitedError        429; ``retry_after`` seconds when the vendor said so
    │   ├── OverloadedError         529/503; the vendor is overloaded (retryable)
    │   ├── BadRequestError         400/404/422; the request is wrong (not retryable)
    │   │   └── ContextTooLongError the prompt does not fit the model's context window
    │   ├── ProviderTimeoutError    no reply within the deadline
    │   ├── ProviderConnectionError the endpoint could not be reached / stream cut off
    │   └── CircuitOpenError        the model's circuit breaker is open; failing fast
    ├── AgentError                  an agent session could not go on as asked
    │   └── BudgetExceededError     the session's budget (calls, tokens, cost, wall) is spent
    ├── StoreError                  the durable store failed (I/O, a locked or corrupt file)
    │   ├── StoreConflictError      a write lost a race or broke an invariant; nothing written
    │   ├── StoreNotFoundError      no session (or call) with that id
    │   └── StoreVersionError       the database file was written by a newer sunroom
    ├── ServiceError                a sunroom service could not be reached or failed unexplained
    └── EmbeddingModelError         an embedding model could not be fetched or loaded, or its parts
                                    disagree (corrupt file, missing tokenizer, vocab/size mismatch)

User code that fails *inside* a kernel never raises on the host: it comes back as data in an
``ExecutionResult`` (its ``error`` is a :class:`~sunroom.sandbox.result.CellError`, a record,
not an exception).

Inside the kernel, code that calls a host function sees mirrors of the ``HostFunction*``
classes with the same names (``sunroom.prelude.hostcall``; the agent's ``BudgetExceededError``
in ``sunroom.prelude.agent``): the host raises the class here, the RPC edge carries its name,
and the kernel raises its mirror. Every class here is raised somewhere (a test checks).
"""

from __future__ import annotations

from typing import Any, final

__all__ = [
    "AgentError",
    "ApprovalDenied",
    "ApprovalNotPending",
    "AuthenticationError",
    "BadRequestError",
    "BudgetExceededError",
    "CircuitOpenError",
    "EmbeddingModelError",
    "ClosedError",
    "ContextTooLongError",
    "FileError",
    "HostFunctionArgumentError",
    "HostFunctionBudgetExceeded",
    "HostFunctionBusy",
    "HostFunctionError",
    "McpServerError",
    "McpToolError",
    "HostFunctionNotFound",
    "HostFunctionTimeout",
    "KernelDiedError",
    "ForkError",
    "KernelError",
    "KernelStartError",
    "OverloadedError",
    "PackageInstallError",
    "ProtocolError",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderTimeoutError",
    "RateLimitedError",
    "SandboxUnavailableError",
    "ServiceError",
    "StoreConflictError",
    "StoreError",
    "StoreNotFoundError",
    "StoreVersionError",
    "SunroomError",
    "UsageError",
]


class SunroomError(Exception):
    """Root of every error sunroom raises."""


# --- the caller must act ---------------------------------------------------------------------


class UsageError(SunroomError, ValueError):
    """The API was called wrongly (bad option, reserved name, wrong type)."""


class ClosedError(UsageError):
    """An operation was attempted on something already closed."""


@final
class FileError(UsageError):
    """A file operation in a kernel's workdir was refused or failed; nothing was changed.

    ``reason`` says why, as a short token the caller can branch on: ``"refused"`` (the path is
    absolute, has ``..`` or NUL, or leads out of the workdir through a symbolic link),
    ``"not_found"``, ``"is_dir"``, ``"not_dir"``, ``"no_space"`` (the workdir's size limit or
    the kernel's file size limit), ``"too_many"`` (a listing over its cap, too many transfers
    open), ``"too_big"`` (a file over the caller's size cap, e.g. ``sunroom mcp``'s
    ``read_file``) or ``"failed"`` (another operating system error).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@final
class ApprovalNotPending(UsageError):
    """No approval request of that call id waits: ``answered`` says it was answered already.

    (``answered=False``: the id was never requested by this session.)
    """

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


# --- the kernel failed ---------------------------------------------------------------------


class KernelError(SunroomError):
    """The kernel process failed; the handle restarts it on the next use."""


class KernelStartError(KernelError):
    """The kernel could not be started or did not say hello in time."""


class KernelDiedError(KernelError):
    """The kernel process died; ``reason`` classifies how (exit code, signal, OOM)."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class ForkError(KernelError):
    """The kernel cannot be forked in its present state; nothing was copied.

    It is busy (a cell, a bind, a file transfer) or its code left threads running; the kernel
    goes on as it was.
    """


class SandboxUnavailableError(KernelError):
    """A backend cannot provide its isolation boundary; the message says how to fix it.

    Raised instead of silently falling back to a weaker sandbox.
    """


# --- the wire was violated -----------------------------------------------------------------


class PackageInstallError(SunroomError):
    """Installing packages into a kernel failed; the message carries pip's reason.

    No such package, an import that fails, over the size or time budget, nowhere to look. The
    kernel runs on, its site dir as it was before the install.
    """


class ProtocolError(SunroomError):
    """A peer broke the wire protocol (bad frame, oversized frame, stalled frame, bad shape)."""


# --- host functions ------------------------------------------------------------------------


class HostFunctionError(SunroomError):
    """A host function could not be called as asked."""


class HostFunctionNotFound(HostFunctionError):
    """No host function of that name is registered."""


class HostFunctionArgumentError(HostFunctionError):
    """The arguments failed validation; the message lists each bad field."""


class HostFunctionTimeout(HostFunctionError):
    """The host function ran past its timeout and was cancelled."""


class HostFunctionBusy(HostFunctionError):
    """The host function's concurrency limit stayed full for its whole timeout."""


class HostFunctionBudgetExceeded(HostFunctionError):
    """The host function's call budget for this kernel is spent."""


class McpServerError(HostFunctionError):
    """An MCP server could not be started or reached, or exited during a call.

    Raised at kernel or session start when a server fails to connect, and (as its kernel-side
    mirror) in a cell whose tool call found the server gone; the server is restarted at the next
    call.
    """


class McpToolError(HostFunctionError):
    """An MCP tool ran and reported an error (``isError``); the message is the server's."""


class ApprovalDenied(HostFunctionError, PermissionError):
    """The call was refused by its approval policy, a person, or an approval that timed out.

    Its message names the function and says why. Inside the kernel the call raises the mirror
    class of the same name (``sunroom.prelude.hostcall.ApprovalDenied``, a PermissionError).
    """


# --- model providers -----------------------------------------------------------------------


class ProviderError(SunroomError):
    """A model provider failed.

    ``provider`` names the adapter, ``status_code`` is the HTTP status when there was one and
    ``retryable`` says whether the retry policy may try again.
    """

    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status_code: int | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status_code = status_code
        self.body = body


class AuthenticationError(ProviderError):
    """The API key is missing, invalid or lacks permission (401/403).

    ``key_env`` names the environment variable the key is read from when the error is that no
    key was found (None otherwise): a command line can say how to set it in its own terms.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status_code: int | None = None,
        body: Any = None,
        key_env: str | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status_code=status_code, body=body)
        self.key_env = key_env


class RateLimitedError(ProviderError):
    """The vendor rate-limited the request (429); ``retry_after`` in seconds when given."""

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status_code: int | None = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, provider=provider, status_code=status_code, body=body)
        self.retry_after = retry_after


class OverloadedError(ProviderError):
    """The vendor is overloaded or failing (5xx, Anthropic 529)."""

    retryable = True


class BadRequestError(ProviderError):
    """The request is malformed or names something that does not exist; not retryable."""


class ContextTooLongError(BadRequestError):
    """The prompt does not fit the model's context window."""


class ProviderTimeoutError(ProviderError):
    """The vendor did not answer within the deadline."""

    retryable = True


class ProviderConnectionError(ProviderError):
    """The endpoint could not be reached, or a stream was cut off mid-way."""

    retryable = True


class CircuitOpenError(ProviderError):
    """The model's circuit breaker is open after repeated failures; the call failed fast."""


# --- agent sessions ------------------------------------------------------------------------


class AgentError(SunroomError):
    """An agent session could not go on as asked."""


class BudgetExceededError(AgentError):
    """A session budget is spent; ``limit`` names it (model_calls, tokens, cost, wall_time).

    Raised on the host before a model call that the budget no longer allows; inside the kernel
    ``predict``/``predict_many`` raise an exception of the same name.
    """

    def __init__(self, message: str, *, limit: str = "") -> None:
        super().__init__(message)
        self.limit = limit


# --- the durable store --------------------------------------------------------------------


class StoreError(SunroomError):
    """The store failed: the database file could not be read or written (the operator acts)."""


@final
class StoreConflictError(StoreError):
    """A write was refused and nothing was written.

    ``reason`` says why, as a short token the caller can branch on:

    - ``"not_owner"``: the caller does not own the session (another owner claimed it);
    - ``"seq"``: the events do not continue exactly from the last stored seq (a gap or a
      duplicate); ``last_seq`` is the stored one, so the caller can resynchronise;
    - ``"exists"``: the session, the call's start or the kernel's placement is already
      recorded (``session_id`` is empty for a kernel);
    - ``"finished"``: the call already has its one outcome, or the session's run already
      ended;
    - ``"not_started"``: a call was finished that was never recorded as started.
    """

    def __init__(
        self, message: str, *, reason: str, session_id: str = "", last_seq: int | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.session_id = session_id
        self.last_seq = last_seq


@final
class StoreNotFoundError(StoreError):
    """No session, or no call record, has that id (it never existed or was purged)."""


@final
class StoreVersionError(StoreError):
    """The database's schema is newer than this sunroom knows; upgrade sunroom to open it."""


# --- a sunroom service, seen by its client --------------------------------------------------


class ServiceError(SunroomError):
    """A sunroom service could not be reached, or failed without saying how (``sunroom.client``).

    ``status`` is the HTTP status of its answer, None when it could not be reached at all. An
    error the service did explain comes back as the class it named (its ``type``).
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# --- local embedding models ---------------------------------------------------------------


@final
class EmbeddingModelError(SunroomError):
    """An embedding model could not be used: the operator must fix or replace its files.

    Raised when a model cannot be fetched (the endpoint refused, a remote file name would land
    outside the cache), when its ONNX file is corrupt or lacks the inputs an encoder needs, when
    ``tokenizer.json`` is missing or unreadable, or when the tokenizer and the graph disagree
    (token ids past the embedding table, a hidden size other than config.json's).
    """
