"""Host-side kernel lifecycle: Kernel, backends, supervisor handles, limits, host functions."""

from sunroom.sandbox.functions import FunctionRegistry, HostFunction, host_function
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.result import CellError, ExecutionResult, Variable
from sunroom.sandbox.sync import Kernel

__all__ = [
    "AsyncKernel",
    "CellError",
    "ExecutionResult",
    "FunctionRegistry",
    "HostFunction",
    "Kernel",
    "Limits",
    "Variable",
    "host_function",
]
