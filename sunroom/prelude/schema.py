"""JSON Schema inside the kernel: constraint metadata, and the schema of a kernel-side type.

JSON Schema is the one description of a type that crosses between the kernel and the host.
The host renders the constraints it enforces onto the kernel's wrappers and dataclass mirrors as
``Annotated[int, Schema(minimum=0)]``; :func:`schema_of` turns a kernel-side type (a mirror, a
dataclass the code defined, an enum, ``list[str]``, ``Literal[...]``, a union ...) back into a
JSON Schema, constraints included, for ``predict(output=...)``.

Nothing here validates: the host is the authority (it validates with ``jsonschema`` or
pydantic). Standard library only.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import types
import typing
from collections.abc import Iterator, Mapping

__all__ = ["Schema", "schema_of"]

_Json = dict[str, typing.Any]


class Schema(Mapping[str, typing.Any]):
    """JSON Schema keywords attached to a type: ``Annotated[int, Schema(minimum=0)]``.

    An immutable, hashable mapping (a plain ``dict`` cannot sit inside an ``Annotated`` that is
    part of a union). A plain ``dict`` in ``Annotated`` is read the same way by
    :func:`schema_of`.
    """

    __slots__ = ("_items",)

    def __init__(self, keywords: Mapping[str, typing.Any] | None = None, /, **more: typing.Any):
        items = dict(keywords or {})
        items.update(more)
        self._items = items

    def __getitem__(self, key: str) -> typing.Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(repr(sorted(self._items.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{k}={v!r}" if k.isidentifier() else f"**{{{k!r}: {v!r}}}"
            for k, v in self._items.items()
        )
        return f"Schema({inner})"


_SCALARS: dict[typing.Any, _Json] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    bytes: {"type": "string"},
    datetime.datetime: {"type": "string", "format": "date-time"},
    datetime.date: {"type": "string", "format": "date"},
    datetime.time: {"type": "string", "format": "time"},
}
_STRINGLIKE = frozenset({"decimal", "uuid", "pathlib"})
_MAX_DEPTH = 40


def schema_of(tp: typing.Any) -> _Json:
    """The JSON Schema of kernel-side type *tp*; a mapping is taken as a JSON Schema already.

    Dataclasses become objects (``additionalProperties: false``, fields with defaults are not
    required, the docstring is the description); nested dataclasses go in ``$defs``. Constraints
    come from ``Annotated[T, Schema(...)]`` (or a plain dict). Raises TypeError for a type it
    cannot describe.
    """
    if isinstance(tp, Mapping):
        return dict(tp)
    builder = _Builder()
    root = builder.schema(tp, 0, root=True)
    if builder.defs:
        root["$defs"] = builder.defs
    return root


def _simple(tp: object) -> _Json | None:
    """The schema of None, Any, object and the scalar types; None for any other type."""
    if tp is None or tp is type(None):
        return {"type": "null"}
    if tp is typing.Any or tp is object:
        return {}
    if isinstance(tp, type) and tp in _SCALARS:  # a type: hashable, unlike some aliases
        return dict(_SCALARS[tp])
    if tp is datetime.timedelta:
        return {"type": "number"}  # seconds on the wire
    return None


class _Builder:
    def __init__(self) -> None:
        self.defs: _Json = {}
        self.names: dict[type, str] = {}
        self.root: type | None = None

    def schema(self, tp: object, depth: int, *, root: bool = False) -> _Json:
        if depth > _MAX_DEPTH:
            raise TypeError("the type is nested too deeply to describe")
        simple = _simple(tp)
        if simple is not None:
            return simple
        d = depth + 1
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            out = self.schema(args[0], d, root=root)
            for extra in args[1:]:
                if isinstance(extra, Mapping):
                    out.update(extra)
            return out
        if origin in (typing.Union, types.UnionType):
            return {"anyOf": [self.schema(a, d) for a in args]}
        if origin is typing.Literal:
            values = list(args)
            return {"const": values[0]} if len(values) == 1 else {"enum": values}
        container = self._container(tp, origin, args, d)
        if container is not None:
            return container
        return self._class(tp, d, root=root)

    def _container(
        self, tp: object, origin: object, args: tuple[object, ...], d: int
    ) -> _Json | None:
        """The schema of a list, set, tuple or dict type; None for any other type."""
        if tp in (list, set, frozenset) or origin in (list, set, frozenset):
            out: _Json = {"type": "array"}
            if args:
                out["items"] = self.schema(args[0], d)
            return out
        if tp is tuple or origin is tuple:
            if not args:
                return {"type": "array"}
            if len(args) == 2 and args[1] is Ellipsis:
                return {"type": "array", "items": self.schema(args[0], d)}
            prefix = [self.schema(a, d) for a in args]
            return {"type": "array", "prefixItems": prefix, "minItems": len(prefix),
                    "maxItems": len(prefix)}  # fmt: skip
        if tp is dict or origin is dict:
            out = {"type": "object"}
            if len(args) == 2:
                out["additionalProperties"] = self.schema(args[1], d)
            return out
        return None

    def _class(self, tp: object, d: int, *, root: bool) -> _Json:
        """The schema of an enum, a dataclass or a str-like class; TypeError for another."""
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"enum": [m.value for m in tp]}
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self._dataclass(tp, d, root=root)
        if isinstance(tp, type) and tp.__module__ in _STRINGLIKE:
            return {"type": "string"}
        raise TypeError(f"cannot describe {tp!r} as a JSON Schema; use a dataclass or a type")

    def _dataclass(self, tp: type, depth: int, *, root: bool) -> _Json:
        if root:
            self.root = tp
        elif tp is self.root:
            return {"$ref": "#"}
        elif tp in self.names:
            return {"$ref": f"#/$defs/{self.names[tp]}"}
        if not root:
            name, n = tp.__name__, 2
            while name in self.defs:
                name, n = f"{tp.__name__}{n}", n + 1
            self.names[tp] = name
            self.defs[name] = {}  # reserved: a recursive reference finds the name
        try:
            hints = typing.get_type_hints(tp, include_extras=True)
        except Exception:  # an annotation that does not resolve in the kernel: typed by name
            hints = {}
        properties: _Json = {}
        required: list[str] = []
        for f in dataclasses.fields(tp):
            prop = self.schema(hints.get(f.name, typing.Any), depth)
            if f.default is not dataclasses.MISSING:
                default = f.default.value if isinstance(f.default, enum.Enum) else f.default
                if isinstance(default, str | int | float | bool | None):
                    prop["default"] = default
            elif f.default_factory is dataclasses.MISSING:
                required.append(f.name)
            properties[f.name] = prop
        out: _Json = {"type": "object", "title": tp.__name__}
        doc = tp.__doc__
        if doc and not doc.startswith(f"{tp.__name__}("):  # not the generated signature
            out["description"] = doc.strip()
        out["properties"] = properties
        out["required"] = required
        out["additionalProperties"] = False
        if root:
            return out
        self.defs[self.names[tp]] = out
        return {"$ref": f"#/$defs/{self.names[tp]}"}
