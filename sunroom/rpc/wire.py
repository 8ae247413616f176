"""Conversion between Python objects and msgpack-safe values, shared by both ends.

Lives in ``rpc`` because the host (argument and result conversion in
:mod:`sunroom.sandbox.functions`) and the kernel (:mod:`sunroom.prelude.hostcall`) both use it;
like the rest of ``rpc`` it imports only the standard library.

Host functions' pydantic models arrive in the kernel as plain dataclasses and enums (generated
source). :func:`to_wire` flattens such objects for the wire; :func:`from_wire` rebuilds them from
the annotation a generated wrapper declares as its return type.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import datetime
else:  # the very types datetime.py exports, without its pure-Python twin (~1.2 ms of a start)
    import _datetime as datetime

_SCALARS = (str, int, float, bool, bytes, type(None))


def to_wire(value: object, fallback: Callable[[object], object] | None = None) -> object:
    """Return *value* as msgpack-safe data (dataclasses → maps, enums → values, ...).

    *fallback* converts types this module does not know (the host passes one for pydantic
    models); without it, or when it returns NotImplemented, such values raise TypeError.
    """
    if isinstance(value, _SCALARS):
        return value
    # no value is an Enum before something imports enum (a kernel's start skips its ~1 ms)
    enum = sys.modules.get("enum")
    if enum is not None and isinstance(value, enum.Enum):
        return to_wire(value.value, fallback)
    fields = getattr(type(value), "__dataclass_fields__", None)
    if fields is not None:
        return {name: to_wire(getattr(value, name), fallback) for name in fields}
    if isinstance(value, dict):
        return {to_wire(k, fallback): to_wire(v, fallback) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_wire(v, fallback) for v in value]
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo is not None else value.isoformat()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if _is_stringlike(value):
        return str(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if fallback is not None:
        converted = fallback(value)
        if converted is not NotImplemented:
            return to_wire(converted, fallback)
    raise TypeError(f"cannot send a {type(value).__name__} over the wire")


def _is_stringlike(value: object) -> bool:
    """Decimal, UUID or a path: checked without importing those modules."""
    for module, name in (("decimal", "Decimal"), ("uuid", "UUID"), ("pathlib", "PurePath")):
        mod = sys.modules.get(module)
        if mod is not None and isinstance(value, getattr(mod, name)):
            return True
    return False


def _typing_form(tp: object, name: str) -> bool:
    """Whether *tp* is ``typing.<name>`` (without importing typing if nobody has)."""
    typing = sys.modules.get("typing")
    return typing is not None and tp is getattr(typing, name, None)


def from_wire(tp: object, value: object) -> object:
    """Rebuild *value* as annotation *tp* where the shape fits; otherwise return it unchanged.

    *tp* None or ``typing.Any`` returns *value* as it is.
    """
    if value is None or tp is None or _typing_form(tp, "Any"):
        return value
    if isinstance(tp, types.UnionType):
        return _from_union(tp.__args__, value)
    if hasattr(tp, "__metadata__"):  # Annotated[T, ...]
        return from_wire(getattr(tp, "__origin__", None), value)
    origin = getattr(tp, "__origin__", None)
    if origin is not None:
        args: tuple[object, ...] = getattr(tp, "__args__", ())
        if _typing_form(origin, "Union"):
            return _from_union(args, value)
        if origin in (list, set, frozenset) and isinstance(value, list):
            inner = args[0] if args else None
            return origin(from_wire(inner, v) for v in value)
        if origin is tuple and isinstance(value, list):
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(from_wire(args[0], v) for v in value)
            if len(args) == len(value):
                return tuple(from_wire(a, v) for a, v in zip(args, value, strict=True))
            return tuple(value)
        if origin is dict and isinstance(value, dict):
            kt, vt = args if len(args) == 2 else (None, None)
            return {from_wire(kt, k): from_wire(vt, v) for k, v in value.items()}
        return value  # Literal, collections.abc generics, ...: as sent
    if isinstance(tp, type):
        return _from_class(tp, value)
    return value


def _from_union(arms: tuple[object, ...], value: object) -> object:
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


def _from_class(tp: type, value: object) -> object:
    hook = getattr(tp, "__sunroom_from_wire__", None)
    if hook is not None:  # a kernel-side type that rebuilds itself (e.g. MCP content)
        return hook(value)
    fields = getattr(tp, "__dataclass_fields__", None)
    if fields is not None and isinstance(value, dict):
        kwargs = {}
        for name, f in fields.items():
            if name in value:
                kwargs[name] = from_wire(f.type, value[name])
        return tp(**kwargs)
    enum = sys.modules.get("enum")
    if enum is not None and issubclass(tp, enum.Enum):
        return tp(value)
    if tp is datetime.datetime and isinstance(value, str):
        return datetime.datetime.fromisoformat(value)
    if tp is datetime.date and isinstance(value, str):
        return datetime.date.fromisoformat(value)
    if tp is datetime.time and isinstance(value, str):
        return datetime.time.fromisoformat(value)
    if tp is datetime.timedelta and isinstance(value, int | float):
        return datetime.timedelta(seconds=value)
    if isinstance(value, str) and tp.__module__ in ("decimal", "uuid", "pathlib"):
        return tp(value)
    if tp in (tuple, set, frozenset) and isinstance(value, list):
        return tp(value)
    if tp is float and isinstance(value, int):
        return float(value)
    return value
