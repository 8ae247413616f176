"""Turning type specs from the kernel into pydantic types, and validation messages.

The kernel describes ``predict(output=T)`` as a *type spec* (see :mod:`sunroom.agent.shim`):
``{"kind": "str" | "int" | "float" | "bool" | "none" | "any"}``, ``{"kind": "list", "item":
spec}``, ``{"kind": "dict", "value": spec}``, ``{"kind": "union", "options": [spec]}``,
``{"kind": "literal", "values": [...]}`` or ``{"kind": "object", "name", "doc", "fields":
[{"name", "type", "default"?}]}``. :func:`type_from_spec` builds the matching pydantic type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal, Union

import pydantic

from sunroom.errors import UsageError

__all__ = ["explain", "parse_json_reply", "structured", "type_from_spec"]

_SCALARS: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "none": None}
_MAX_DEPTH = 20


def type_from_spec(spec: Any, *, _depth: int = 0) -> Any:
    """The pydantic-ready type a spec describes. Raises UsageError for a malformed spec."""
    if _depth > _MAX_DEPTH:
        raise UsageError("the output type is nested too deeply")
    if not isinstance(spec, Mapping):
        raise UsageError(f"a type spec must be a map, got {type(spec).__name__}")
    kind = spec.get("kind")
    if kind == "any":
        return Any
    if kind in _SCALARS:
        return _SCALARS[kind] if kind != "none" else type(None)
    d = _depth + 1
    if kind == "list":
        return list[type_from_spec(spec.get("item", {"kind": "any"}), _depth=d)]  # type: ignore[misc]
    if kind == "dict":
        return dict[str, type_from_spec(spec.get("value", {"kind": "any"}), _depth=d)]  # type: ignore[misc]
    if kind == "union":
        options = tuple(type_from_spec(o, _depth=d) for o in spec.get("options") or ())
        if not options:
            raise UsageError("a union spec needs options")
        return Union[options]  # noqa: UP007 - built from a runtime tuple
    if kind == "literal":
        values = spec.get("values") or []
        if not values or not all(isinstance(v, str | int | float | bool | None) for v in values):
            raise UsageError("a literal spec needs scalar values")
        return Literal[tuple(values)]
    if kind == "object":
        return _object(spec, d)
    raise UsageError(f"unknown type spec kind {kind!r}")


def _object(spec: Mapping[str, Any], depth: int) -> type[pydantic.BaseModel]:
    name = str(spec.get("name") or "Output")
    if not name.isidentifier():
        name = "Output"
    fields: dict[str, Any] = {}
    for field in spec.get("fields") or []:
        if not isinstance(field, Mapping) or not str(field.get("name", "")).isidentifier():
            raise UsageError("an object spec's fields need identifier names")
        tp = type_from_spec(field.get("type", {"kind": "any"}), _depth=depth)
        default = field.get("default", ...)
        fields[str(field["name"])] = (tp, default)
    model: type[pydantic.BaseModel] = pydantic.create_model(
        name, __doc__=spec.get("doc") or None, **fields
    )
    return model


def structured(tp: Any) -> tuple[dict[str, Any], bool]:
    """A JSON schema for structured output of *tp*, and whether it wraps *tp* as ``value``.

    Vendors want an object at the root, so a non-model type is asked for as
    ``{"value": <tp>}``.
    """
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        return tp.model_json_schema(), False
    wrapper = pydantic.create_model("Output", value=(tp, ...))
    return wrapper.model_json_schema(), True


_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*?)\n\s*```\s*$", re.DOTALL)


def parse_json_reply(text: str) -> Any:
    """Parse a reply that should be one JSON value (a ```json fence around it is accepted).

    Raises ValueError when it is not JSON.
    """
    match = _FENCE.match(text)
    body = match.group(1) if match else text.strip()
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        shown = body if len(body) <= 200 else body[:200] + "..."
        raise ValueError(f"the reply is not JSON ({exc.msg}): {shown!r}") from None


def explain(exc: pydantic.ValidationError, *, title: str) -> str:
    """A per-field message: one line per problem, with the offending value."""
    lines = [title]
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(value)"
        got = repr(err.get("input"))
        if len(got) > 80:
            got = got[:77] + "..."
        lines.append(f"  {where}: {err['msg']} (got {got})")
    return "\n".join(lines)
