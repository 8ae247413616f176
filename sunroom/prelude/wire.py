"""Conversion between kernel-side Python objects and msgpack-safe values.

Host functions' pydantic models arrive in the kernel as plain dataclasses and enums (generated
source). :func:`to_wire` flattens such objects for the wire; :func:`from_wire` rebuilds them from
the annotation a generated wrapper declares as its return type.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import pathlib
import types
import typing
import uuid
from typing import Any

_SCALARS = (str, int, float, bool, bytes, type(None))


def to_wire(value: Any) -> Any:
    """Return *value* as msgpack-safe data (dataclasses → maps, enums → values, ...)."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, enum.Enum):
        return to_wire(value.value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {to_wire(k): to_wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_wire(v) for v in value]
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo is not None else value.isoformat()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID | pathlib.PurePath):
        return str(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"cannot send a {type(value).__name__} to the host")


def from_wire(tp: Any, value: Any) -> Any:
    """Rebuild *value* as annotation *tp* where the shape fits; otherwise return it unchanged."""
    if value is None or tp is Any or tp is None:
        return value
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return from_wire(typing.get_args(tp)[0], value)
    if origin in (typing.Union, types.UnionType):
        return _from_union(typing.get_args(tp), value)
    if origin is not None:
        args = typing.get_args(tp)
        if origin in (list, set, frozenset) and isinstance(value, list):
            inner = args[0] if args else Any
            return origin(from_wire(inner, v) for v in value)
        if origin is tuple and isinstance(value, list):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(from_wire(args[0], v) for v in value)
            if len(args) == len(value):
                return tuple(from_wire(a, v) for a, v in zip(args, value, strict=True))
            return tuple(value)
        if origin is dict and isinstance(value, dict):
            kt, vt = args if len(args) == 2 else (Any, Any)
            return {from_wire(kt, k): from_wire(vt, v) for k, v in value.items()}
        return value
    if isinstance(tp, type):
        return _from_class(tp, value)
    return value


def _from_union(arms: tuple[Any, ...], value: Any) -> Any:
    for arm in arms:
        if arm is type(None):
            continue
        if isinstance(arm, type) and isinstance(value, arm) and not isinstance(value, dict):
            return value
    for arm in arms:
        if arm is type(None):
            continue
        try:
            out = from_wire(arm, value)
        except (TypeError, ValueError):
            continue
        if out is not value or not isinstance(value, dict | list):
            return out
    return value


def _from_class(tp: type, value: Any) -> Any:
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = from_wire(f.type, value[f.name])
        return tp(**kwargs)
    if issubclass(tp, enum.Enum):
        return tp(value)
    if tp is datetime.datetime and isinstance(value, str):
        return datetime.datetime.fromisoformat(value)
    if tp is datetime.date and isinstance(value, str):
        return datetime.date.fromisoformat(value)
    if tp is datetime.time and isinstance(value, str):
        return datetime.time.fromisoformat(value)
    if tp is datetime.timedelta and isinstance(value, int | float):
        return datetime.timedelta(seconds=value)
    if tp in (decimal.Decimal, uuid.UUID, pathlib.Path) and isinstance(value, str):
        return tp(value)
    if tp in (tuple, set, frozenset) and isinstance(value, list):
        return tp(value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value
