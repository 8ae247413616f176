"""Calling host functions from inside the kernel, and the exceptions such calls raise.

Generated wrappers call :func:`call`; it sends a ``call`` request over the kernel's channel and
blocks the calling thread (any thread may call, many at once) until the host answers. An error
answer is raised here as the matching exception below, or as the builtin exception the host
function raised (``ValueError``, ``KeyError``, ...), so ordinary ``except`` clauses work.
"""

from __future__ import annotations

import builtins

from sunroom.rpc.blocking import BlockingChannel, CallFailed
from sunroom.rpc.wire import from_wire, to_wire


class HostFunctionError(Exception):
    """A host function could not be called, or failed on the host."""


class HostFunctionNotFound(HostFunctionError, NameError):
    """No host function of that name exists."""


class HostFunctionArgumentError(HostFunctionError, TypeError):
    """The host rejected the arguments; the message lists each bad field."""


class HostFunctionTimeout(HostFunctionError, TimeoutError):
    """The host function ran past its timeout."""


class HostFunctionBusy(HostFunctionError):
    """Too many calls to this host function are already running."""


class HostFunctionBudgetExceeded(HostFunctionError):
    """The kernel has used up the function's call budget."""


class ApprovalDenied(HostFunctionError, PermissionError):
    """The call was not approved (a policy, a person, no answer in time); the message says why."""


_BY_NAME: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        HostFunctionError,
        HostFunctionNotFound,
        HostFunctionArgumentError,
        HostFunctionTimeout,
        HostFunctionBusy,
        HostFunctionBudgetExceeded,
        ApprovalDenied,
    )
}

_channel: BlockingChannel | None = None


def register(cls: type[Exception]) -> None:
    """Raise *cls* for an error answer whose type name is ``cls.__name__``.

    Kernel-side mirrors of host errors (e.g. the agent's ``BudgetExceededError``) register
    here: an answer is matched by the type name the protocol carries, never by its message.
    """
    _BY_NAME[cls.__name__] = cls


def attach(channel: BlockingChannel) -> None:
    """Route calls through *channel* (the runtime does this at boot)."""
    global _channel
    _channel = channel


def attached() -> bool:
    """Whether calls have a channel to go through."""
    return _channel is not None


def _exception_for(name: str, error_type: str, message: str) -> Exception:
    cls = _BY_NAME.get(error_type)
    if cls is not None:
        return cls(message)
    builtin = getattr(builtins, error_type, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception):
        try:
            exc = builtin(message)
        except Exception:
            exc = HostFunctionError(f"{name}() raised {error_type}: {message}")
        else:
            exc.add_note(f"(raised by host function {name}())")
        return exc
    return HostFunctionError(f"{name}() raised {error_type}: {message}")


def call(name: str, args: dict[str, object], returns: object = None) -> object:
    """Call host function *name* with keyword *args*; return the result rebuilt as *returns*.

    *returns* is the wrapper's return annotation; None returns the wire value as it is.
    """
    if _channel is None:
        raise HostFunctionError("host functions are unavailable: the kernel is not connected")
    try:
        payload = {k: to_wire(v) for k, v in args.items()}
    except TypeError as exc:
        raise HostFunctionArgumentError(f"{name}(): {exc}") from None
    try:
        result = _channel.call("call", {"name": name, "args": payload})
    except CallFailed as failed:
        raise _exception_for(name, failed.error.type, failed.error.message) from None
    except ConnectionError:
        raise HostFunctionError(f"{name}(): the host connection is closed") from None
    return from_wire(returns, result)
