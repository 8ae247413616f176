"""sunroom: a fast, typed, isolated runtime for agents that act by writing Python.

The public API is re-exported here lazily, so the kernel side (which imports only
``sunroom.rpc`` and ``sunroom.prelude``) never pays for, or needs, host dependencies.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "AsyncKernel": "sunroom.sandbox.kernel",
    "Kernel": "sunroom.sandbox.sync",
    "KernelPool": "sunroom.sandbox.pool",
    "Template": "sunroom.sandbox.template",
    "JupyterBackend": "sunroom.sandbox.backends.jupyter",
    "Limits": "sunroom.sandbox.limits",
    "Network": "sunroom.network.policy",
    "Packages": "sunroom.sandbox.packages",
    "InstalledPackage": "sunroom.sandbox.packages",
    "PackageInstallError": "sunroom.errors",
    "File": "sunroom.sandbox.inputs",
    "Directory": "sunroom.sandbox.inputs",
    "ExecutionResult": "sunroom.sandbox.result",
    "CellError": "sunroom.sandbox.result",
    "DisplayItem": "sunroom.sandbox.result",
    "Variable": "sunroom.sandbox.result",
    "HostFunction": "sunroom.sandbox.functions",
    "host_function": "sunroom.sandbox.functions",
    "SunroomError": "sunroom.errors",
    "UsageError": "sunroom.errors",
    "KernelError": "sunroom.errors",
    "KernelStartError": "sunroom.errors",
    "KernelDiedError": "sunroom.errors",
    "ForkError": "sunroom.errors",
    "SandboxUnavailableError": "sunroom.errors",
    "ProtocolError": "sunroom.errors",
    "HostFunctionError": "sunroom.errors",
    "McpServerError": "sunroom.errors",
    "McpToolError": "sunroom.errors",
    "ProviderError": "sunroom.errors",
    "ClosedError": "sunroom.errors",
    "StoreError": "sunroom.errors",
    "SQLiteStore": "sunroom.store",
    "BudgetExceededError": "sunroom.errors",
    "AsyncSession": "sunroom.agent",
    "Session": "sunroom.agent",
    "SessionOptions": "sunroom.agent",
    "Budget": "sunroom.agent",
    "RunResult": "sunroom.agent",
    "Hooks": "sunroom.agent",
    "ApprovalCall": "sunroom.agent",
    "Decision": "sunroom.agent",
    "ApprovalDenied": "sunroom.errors",
    "model": "sunroom.providers",
    "Model": "sunroom.providers",
    "Request": "sunroom.providers",
    "Response": "sunroom.providers",
    "Settings": "sunroom.providers",
    "SystemMessage": "sunroom.providers",
    "UserMessage": "sunroom.providers",
    "AssistantMessage": "sunroom.providers",
    "ToolResultMessage": "sunroom.providers",
    "ToolSpec": "sunroom.providers",
    "ToolCall": "sunroom.providers",
    "OutputSchema": "sunroom.providers",
    "ScriptedModel": "sunroom.providers",
    "FunctionModel": "sunroom.providers",
}

__all__ = [
    "ApprovalCall",
    "ApprovalDenied",
    "AssistantMessage",
    "AsyncKernel",
    "AsyncSession",
    "Budget",
    "BudgetExceededError",
    "ClosedError",
    "CellError",
    "Decision",
    "Directory",
    "DisplayItem",
    "ExecutionResult",
    "File",
    "ForkError",
    "FunctionModel",
    "Hooks",
    "InstalledPackage",
    "HostFunction",
    "HostFunctionError",
    "JupyterBackend",
    "Kernel",
    "KernelDiedError",
    "KernelError",
    "KernelPool",
    "KernelStartError",
    "Limits",
    "McpServerError",
    "McpToolError",
    "Model",
    "Network",
    "OutputSchema",
    "PackageInstallError",
    "Packages",
    "ProtocolError",
    "ProviderError",
    "Request",
    "Response",
    "RunResult",
    "SQLiteStore",
    "SandboxUnavailableError",
    "ScriptedModel",
    "Session",
    "SessionOptions",
    "Settings",
    "StoreError",
    "SunroomError",
    "SystemMessage",
    "Template",
    "ToolCall",
    "ToolResultMessage",
    "ToolSpec",
    "UsageError",
    "UserMessage",
    "Variable",
    "host_function",
    "mcp",
    "model",
]

if TYPE_CHECKING:
    from sunroom.agent import (
        ApprovalCall,
        AsyncSession,
        Budget,
        Decision,
        Hooks,
        RunResult,
        Session,
        SessionOptions,
    )
    from sunroom.errors import (
        ApprovalDenied,
        BudgetExceededError,
        ClosedError,
        ForkError,
        HostFunctionError,
        KernelDiedError,
        KernelError,
        KernelStartError,
        McpServerError,
        McpToolError,
        PackageInstallError,
        ProtocolError,
        ProviderError,
        SandboxUnavailableError,
        StoreError,
        SunroomError,
        UsageError,
    )
    from sunroom.network.policy import Network
    from sunroom.providers import (
        AssistantMessage,
        FunctionModel,
        Model,
        OutputSchema,
        Request,
        Response,
        ScriptedModel,
        Settings,
        SystemMessage,
        ToolCall,
        ToolResultMessage,
        ToolSpec,
        UserMessage,
        model,
    )
    from sunroom.sandbox.backends.jupyter import JupyterBackend
    from sunroom.sandbox.functions import HostFunction, host_function
    from sunroom.sandbox.inputs import Directory, File
    from sunroom.sandbox.kernel import AsyncKernel
    from sunroom.sandbox.limits import Limits
    from sunroom.sandbox.packages import InstalledPackage, Packages
    from sunroom.sandbox.pool import KernelPool
    from sunroom.sandbox.result import CellError, DisplayItem, ExecutionResult, Variable
    from sunroom.sandbox.sync import Kernel
    from sunroom.sandbox.template import Template
    from sunroom.store import SQLiteStore

    from . import mcp


def _load(module: str) -> Any:
    """Import *module* and return it.

    ``importlib.import_module`` would do, but every kernel imports this package and would pay
    ~0.3 ms at its start to import ``importlib``.
    """
    __import__(module)
    return sys.modules[module]


def __getattr__(name: str) -> Any:
    if name == "mcp":  # a subpackage: sunroom.mcp.stdio(...) after a bare `import sunroom`
        return _load("sunroom.mcp")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sunroom' has no attribute {name!r}")
    value = getattr(_load(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | {"mcp"})
