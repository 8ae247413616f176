"""Kernel-side source that wraps the generated ``predict``/``predict_many`` wrappers.

A type cannot cross the wire, so the kernel's ``predict(..., output=T)`` turns ``T`` (a
dataclass, an enum, ``int``, ``list[str]`` ...) into a *type spec*: a small JSON description
the host turns into a pydantic model (:mod:`sunroom.agent.schema`). The reply comes back as
plain data and is rebuilt as ``T`` with the prelude's ``from_wire``. A failed item of
``predict_many`` comes back as a marker map and is rebuilt as a :class:`PredictError` instance
in its slot. A spent budget is re-raised as ``BudgetExceededError``.

The session runs :data:`SHIM_SOURCE` as a cell after every kernel (re)start.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ERROR_MARKER", "SHIM_SOURCE"]

ERROR_MARKER: Final = "__sunroom_predict_error__"
"""Key of the map that stands for a failed ``predict_many`` item on the wire."""

SHIM_SOURCE: Final = '''
def _sunroom_agent_shim():
    import dataclasses, enum, sys, types, typing
    from sunroom.prelude.hostcall import HostFunctionError
    from sunroom.prelude.wire import from_wire

    generated = sys.modules["sunroom_functions"]
    raw_predict = generated.predict
    raw_predict_many = generated.predict_many

    class PredictError(Exception):
        """A predict_many item that failed: .type and .message say why (returned, not raised)."""

        def __init__(self, type, message):
            super().__init__(f"{type}: {message}")
            self.type = type
            self.message = message

    class BudgetExceededError(HostFunctionError):
        """The session's budget (model calls, tokens, cost or wall time) is spent."""

    def spec(tp):
        if tp is None or tp is type(None):
            return {"kind": "none"}
        if tp is typing.Any or tp is object:
            return {"kind": "any"}
        if tp in (str, int, float, bool):
            return {"kind": tp.__name__}
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            return spec(args[0])
        if origin in (typing.Union, types.UnionType):
            return {"kind": "union", "options": [spec(a) for a in args]}
        if origin is typing.Literal:
            return {"kind": "literal", "values": list(args)}
        if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset):
            return {"kind": "list", "item": spec(args[0]) if args else {"kind": "any"}}
        if tp is dict or origin is dict:
            return {"kind": "dict", "value": spec(args[1]) if len(args) == 2 else {"kind": "any"}}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"kind": "literal", "values": [m.value for m in tp]}
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            try:
                hints = typing.get_type_hints(tp)
            except Exception:
                hints = {}
            fields = []
            for f in dataclasses.fields(tp):
                entry = {"name": f.name, "type": spec(hints.get(f.name, f.type))}
                if f.default is not dataclasses.MISSING and isinstance(
                    f.default, (str, int, float, bool, type(None))
                ):
                    entry["default"] = f.default
                elif f.default is not dataclasses.MISSING or (
                    f.default_factory is not dataclasses.MISSING
                ):
                    entry["default"] = None
                fields.append(entry)
            doc = tp.__doc__ or ""
            return {"kind": "object", "name": tp.__name__, "doc": doc, "fields": fields}
        raise TypeError(f"predict(output=...) cannot describe {tp!r}; use a dataclass or a type")

    def translate(exc):
        text = str(exc)
        if "raised BudgetExceededError:" in text:
            return BudgetExceededError(text.split("raised BudgetExceededError:", 1)[1].strip())
        return None

    def predict(instructions: str, input: typing.Any = None, *, output: typing.Any = None,
                recursive: bool = False) -> typing.Any:
        """Ask a sub-model with a fresh context: instructions plus input (any data).

        With output= a dataclass or a type (int, list[str], Literal[...], ...) the reply is
        structured, validated on the host and returned as that type; else it is a str.
        recursive=True runs the sub-call as its own RLM session (when the depth limit allows).
        """
        wanted = None if output is None else spec(output)
        try:
            data = raw_predict(instructions, input, output=wanted, recursive=recursive)
        except HostFunctionError as exc:
            better = translate(exc)
            if better is None:
                raise
            raise better from None
        return data if output is None else from_wire(output, data)

    def predict_many(instructions: str, inputs: list, *, output: typing.Any = None,
                     recursive: bool = False) -> list:
        """predict() over every input concurrently; results in input order.

        A failed item is a PredictError instance in its slot (check with isinstance).
        """
        wanted = None if output is None else spec(output)
        try:
            rows = raw_predict_many(instructions, list(inputs), output=wanted, recursive=recursive)
        except HostFunctionError as exc:
            better = translate(exc)
            if better is None:
                raise
            raise better from None
        out = []
        for row in rows:
            if isinstance(row, dict) and "__MARKER__" in row:
                err = row["__MARKER__"]
                out.append(PredictError(err.get("type", "Error"), err.get("message", "")))
            else:
                out.append(row if output is None else from_wire(output, row))
        return out

    return predict, predict_many, PredictError, BudgetExceededError


predict, predict_many, PredictError, BudgetExceededError = _sunroom_agent_shim()
del _sunroom_agent_shim
'''.replace("__MARKER__", ERROR_MARKER)
