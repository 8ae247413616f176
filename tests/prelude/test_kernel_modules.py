"""Kernel-side code is real modules that import only the standard library and msgpack."""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
import pkgutil
import subprocess
import sys
from typing import Annotated, Any, Literal

import pytest

import sunroom.prelude
from sunroom.agent.shim import SHIM_SOURCE


def test_every_prelude_module_imports_only_the_stdlib_and_msgpack() -> None:
    names = [f"sunroom.prelude.{m.name}" for m in pkgutil.iter_modules(sunroom.prelude.__path__)]
    assert "sunroom.prelude.agent" in names
    code = (
        "import importlib, json, sys\n"
        "before = set(sys.modules)\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "allowed = sys.stdlib_module_names | {'msgpack', 'sunroom'}\n"
        "loaded = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "cython = {m for m in loaded if m.startswith(('_cython_', 'cython_runtime'))}  # msgpack's\n"
        "bad = sorted(loaded - allowed - cython)\n"
        "host = sorted(m for m in sys.modules if m.startswith('sunroom.')"
        " and not m.startswith(('sunroom.prelude', 'sunroom.rpc')))\n"
        "print(json.dumps([bad, host]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [[], []]


async def test_a_kernel_starts_without_the_costly_standard_modules() -> None:
    """json, re, enum, ctypes, importlib and typing cost a kernel's start ~6 ms together
    (issue 31): none is imported until a cell asks for it."""
    from sunroom import AsyncKernel

    async with AsyncKernel(backend="subprocess") as k:
        r = await k.execute(
            "import sys\n"
            "sorted(m for m in ('json', 're', 'enum', 'ctypes', 'importlib', 'typing', "
            "'asyncio', 'traceback', 'pathlib', 'signal', 'socket', 'datetime') "
            "if m in sys.modules)"
        )
    assert r.ok, r.error
    assert r.value == "[]"


async def test_msgpack_is_imported_without_datetime_py_and_a_cell_still_gets_the_real_one() -> None:
    """The start imports msgpack with ``_datetime`` standing in for ``datetime``
    (sunroom.prelude.boot): a cell's ``import datetime`` is the real module all the same, and
    msgpack's timestamps are its types."""
    from sunroom import AsyncKernel

    async with AsyncKernel(backend="subprocess") as k:
        r = await k.execute(
            "import sys\n"
            "lean = sys.modules['msgpack.ext'].datetime.__name__\n"
            "import datetime, msgpack\n"
            "d = datetime.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=datetime.timezone.utc)\n"
            "back = msgpack.unpackb(msgpack.packb(d, datetime=True), timestamp=3)\n"
            "(lean, datetime.__file__.endswith('datetime.py'), back == d,"
            " type(back) is datetime.datetime,"
            " type(msgpack.Timestamp(1).to_datetime()) is datetime.datetime,"
            " datetime.date.today().year >= 2024)"
        )
    assert r.ok, r.error
    assert r.value == "('_datetime', True, True, True, True, True)"


def test_the_shim_cell_only_imports_the_kernel_module() -> None:
    tree = ast.parse(SHIM_SOURCE)
    assert tree.body and all(isinstance(node, ast.ImportFrom) for node in tree.body)
    assert {node.module for node in tree.body if isinstance(node, ast.ImportFrom)} == {
        "sunroom.prelude.agent"
    }


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Inner:
    """An inner record."""

    n: Annotated[int, {"minimum": 0}]


@dataclasses.dataclass
class Outer:
    name: str
    inner: Inner
    color: Color = Color.RED
    tags: list[str] = dataclasses.field(default_factory=list)
    pair: tuple[int, str] | None = None
    table: dict[str, float] | None = None


def test_kernel_side_json_schema_of_types() -> None:
    from sunroom.prelude.schema import schema_of

    assert schema_of(int) == {"type": "integer"}
    assert schema_of(list[str]) == {"type": "array", "items": {"type": "string"}}
    assert schema_of(Literal["a"]) == {"const": "a"}
    assert schema_of(int | None) == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert schema_of(Any) == {}
    raw = {"type": "integer", "minimum": 0}
    assert schema_of(raw) == raw
    outer = schema_of(Outer)
    assert outer["title"] == "Outer"
    assert outer["required"] == ["name", "inner"] and outer["additionalProperties"] is False
    props = outer["properties"]
    assert props["inner"] == {"$ref": "#/$defs/Inner"}
    assert props["color"] == {"enum": ["red", "blue"], "default": "red"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["pair"]["anyOf"][0] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert props["table"]["anyOf"][0] == {
        "type": "object",
        "additionalProperties": {"type": "number"},
    }
    assert outer["$defs"]["Inner"] == {
        "type": "object",
        "title": "Inner",
        "description": "An inner record.",
        "properties": {"n": {"type": "integer", "minimum": 0}},
        "required": ["n"],
        "additionalProperties": False,
    }
    with pytest.raises(TypeError, match="cannot describe"):
        schema_of(object())
