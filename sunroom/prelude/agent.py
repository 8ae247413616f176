"""``predict``, ``predict_many`` and the agent's exceptions, as code in the kernel sees them.

An agent session runs ``from sunroom.prelude.agent import ...`` as a cell after every kernel
(re)start (:data:`sunroom.agent.shim.SHIM_SOURCE`), so these replace the generated
``predict``/``predict_many`` wrappers in the namespace and call them.

``output=`` is a type (a dataclass, an enum, ``int``, ``list[str]``, ``Literal[...]``, a union
...) or a JSON Schema (a dict). A type is described as JSON Schema by
:func:`sunroom.prelude.schema.schema_of`, constraints included; the host validates the
sub-model's reply against the schema (the kernel is never the authority) and sends plain data,
which is rebuilt here as the type. A failed ``predict_many`` item arrives as a map keyed by
:data:`ERROR_MARKER` and becomes a :class:`PredictError` in its slot. A spent budget raises
:class:`BudgetExceededError`, the kernel-side mirror of the host's error of that name, matched
by the type name the protocol carries.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from sunroom.prelude import hostcall
from sunroom.prelude.hostcall import HostFunctionError
from sunroom.prelude.schema import schema_of
from sunroom.rpc.wire import from_wire

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any, Final

__all__ = ["ERROR_MARKER", "BudgetExceededError", "PredictError", "predict", "predict_many"]

ERROR_MARKER: Final = "__sunroom_predict_error__"
"""Key of the map that stands for a failed ``predict_many`` item on the wire."""

_GENERATED: Final = "sunroom_functions"


class BudgetExceededError(HostFunctionError):
    """The session's budget (model calls, tokens, cost or wall time) is spent.

    The kernel-side mirror of ``sunroom.errors.BudgetExceededError``: ``predict`` and
    ``predict_many`` raise it when the host refuses a model call.
    """


hostcall.register(BudgetExceededError)


class PredictError(Exception):
    """A ``predict_many`` item that failed: ``type`` and ``message`` say why.

    Returned in the item's slot, never raised.
    """

    def __init__(self, type: str, message: str) -> None:  # noqa: A002 - the error's type name
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message


def _wrapper(name: str) -> Any:
    module = sys.modules.get(_GENERATED)
    fn = getattr(module, name, None)
    if fn is None:
        raise HostFunctionError(f"{name}() is unavailable: this kernel is not an agent session's")
    return fn


def _schema(output: object) -> dict[str, object] | None:
    return None if output is None else schema_of(output)


def _rebuild(output: object, data: object) -> object:
    if output is None or isinstance(output, Mapping):
        return data
    return from_wire(output, data)


def predict(
    instructions: str,
    input: object = None,  # noqa: A002 - the name the model knows
    *,
    output: object = None,
    recursive: bool = False,
) -> object:
    """Ask a sub-model with a fresh context: instructions plus input (any data).

    With ``output=`` a type (a dataclass, ``int``, ``list[str]``, ``Literal[...]`` ...) or a
    JSON Schema (a dict) the reply is structured, validated on the host and returned as that
    type (plain data for a schema); else it is a str. An invalid reply raises ValueError naming
    the path that failed. ``recursive=True`` runs the sub-call as its own RLM session (when the
    depth limit allows). Raises BudgetExceededError when the session's budget is spent and
    TypeError for an ``output`` it cannot describe.
    """
    wanted = _schema(output)
    data = _wrapper("predict")(instructions, input, output=wanted, recursive=recursive)
    return _rebuild(output, data)


def predict_many(
    instructions: str,
    inputs: list[object],
    *,
    output: object = None,
    recursive: bool = False,
) -> list[object]:
    """``predict()`` over every input concurrently; results in input order.

    A failed item is a :class:`PredictError` instance in its slot (check with ``isinstance``);
    the call itself raises only BudgetExceededError (the budget is spent) or TypeError (an
    ``output`` it cannot describe).
    """
    wanted = _schema(output)
    rows = _wrapper("predict_many")(instructions, list(inputs), output=wanted, recursive=recursive)
    out: list[object] = []
    for row in rows:
        failure = row.get(ERROR_MARKER) if isinstance(row, dict) else None
        if isinstance(failure, dict):
            out.append(
                PredictError(str(failure.get("type", "Error")), str(failure.get("message", "")))
            )
        else:
            out.append(_rebuild(output, row))
    return out
