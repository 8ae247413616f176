"""sunroom: a fast, typed, isolated runtime for agents that act by writing Python.

The public API is re-exported here lazily, so the kernel side (which imports only
``sunroom.rpc`` and ``sunroom.prelude``) never pays for, or needs, host dependencies.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "AsyncKernel": "sunroom.sandbox.kernel",
    "Kernel": "sunroom.sandbox.sync",
    "Limits": "sunroom.sandbox.limits",
    "ExecutionResult": "sunroom.sandbox.result",
    "ExecutionError": "sunroom.sandbox.result",
    "Variable": "sunroom.sandbox.result",
    "HostFunction": "sunroom.sandbox.functions",
    "host_function": "sunroom.sandbox.functions",
    "SunroomError": "sunroom.errors",
    "UsageError": "sunroom.errors",
    "KernelError": "sunroom.errors",
    "KernelStartError": "sunroom.errors",
    "KernelDiedError": "sunroom.errors",
    "SandboxUnavailableError": "sunroom.errors",
    "ProtocolError": "sunroom.errors",
    "HostFunctionError": "sunroom.errors",
    "ProviderError": "sunroom.errors",
    "ClosedError": "sunroom.errors",
}

__all__ = [
    "AsyncKernel",
    "ClosedError",
    "ExecutionError",
    "ExecutionResult",
    "HostFunction",
    "HostFunctionError",
    "Kernel",
    "KernelDiedError",
    "KernelError",
    "KernelStartError",
    "Limits",
    "ProtocolError",
    "ProviderError",
    "SandboxUnavailableError",
    "SunroomError",
    "UsageError",
    "Variable",
    "host_function",
]

if TYPE_CHECKING:
    from sunroom.errors import (
        ClosedError,
        HostFunctionError,
        KernelDiedError,
        KernelError,
        KernelStartError,
        ProtocolError,
        ProviderError,
        SandboxUnavailableError,
        SunroomError,
        UsageError,
    )
    from sunroom.sandbox.functions import HostFunction, host_function
    from sunroom.sandbox.kernel import AsyncKernel
    from sunroom.sandbox.limits import Limits
    from sunroom.sandbox.result import ExecutionError, ExecutionResult, Variable
    from sunroom.sandbox.sync import Kernel


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sunroom' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
