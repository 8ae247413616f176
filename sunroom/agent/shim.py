"""The cell that installs the agent's helpers in a kernel: one import of a kernel-side module.

``predict``, ``predict_many``, ``PredictError`` and ``BudgetExceededError`` are real code in
:mod:`sunroom.prelude.agent` (standard library and msgpack only, type-checked with the rest).
The session runs :data:`SHIM_SOURCE` as a cell after every kernel (re)start, so they replace
the generated ``predict``/``predict_many`` wrappers in the namespace.
"""

from __future__ import annotations

from typing import Final

from sunroom.prelude.agent import ERROR_MARKER

__all__ = ["ERROR_MARKER", "SHIM_SOURCE"]

SHIM_SOURCE: Final = (
    "from sunroom.prelude.agent import BudgetExceededError, PredictError, predict, predict_many\n"
)
"""The cell a session runs to put the helpers in the kernel's namespace."""
