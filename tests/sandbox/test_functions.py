from __future__ import annotations

import pydantic
import pytest

from sunroom import UsageError, host_function
from sunroom.errors import HostFunctionArgumentError, HostFunctionError, HostFunctionNotFound
from sunroom.sandbox.codegen import generate
from sunroom.sandbox.functions import FunctionRegistry


def add(a: int, b: int = 2) -> int:
    """Add two numbers."""
    return a + b


@pytest.mark.parametrize("name", ["print", "len", "_private", "class", "display", "not an id"])
def test_reserved_and_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(UsageError):
        host_function(add, name=name)


def test_star_args_are_refused() -> None:
    def f(*args: int) -> int:
        return 0

    with pytest.raises(UsageError, match="args"):
        host_function(f)


def test_duplicate_names_are_refused() -> None:
    with pytest.raises(UsageError, match="two host functions"):
        FunctionRegistry([add, host_function(add)])


def test_json_schema_for_prompts() -> None:
    schema = host_function(add).json_schema()
    assert schema["name"] == "add"
    assert schema["description"] == "Add two numbers."
    assert schema["parameters"]["required"] == ["a"]
    assert schema["parameters"]["properties"]["b"]["default"] == 2


async def test_invoke_validates_before_running() -> None:
    calls: list[int] = []

    def record(n: int) -> int:
        calls.append(n)
        return n

    reg = FunctionRegistry([record])
    assert await reg.invoke("record", {"n": "5"}) == 5  # lax coercion, as pydantic does
    with pytest.raises(HostFunctionArgumentError):
        await reg.invoke("record", {"n": "five"})
    with pytest.raises(HostFunctionArgumentError) as info:
        await reg.invoke("record", {"n": 1, "extra": 2})
    assert "extra" in str(info.value)
    with pytest.raises(HostFunctionNotFound):
        await reg.invoke("nope", {})
    assert calls == [5]


async def test_wrong_return_type_is_reported() -> None:
    def liar() -> int:
        return "not an int"  # type: ignore[return-value]

    reg = FunctionRegistry([liar])
    with pytest.raises(HostFunctionError, match="annotation"):
        await reg.invoke("liar", {})


class Point(pydantic.BaseModel):
    """A point."""

    x: int
    y: int = 0


def test_generated_source_has_real_signatures() -> None:
    def norm(p: Point, *, scale: float = 1.0) -> float:
        """Norm of p."""
        return 0.0

    src = generate([host_function(norm)]).source
    assert "class Point:" in src and '"""A point."""' in src
    assert "def norm(p: Point, *, scale: float = 1.0) -> float:" in src
    assert '"""Norm of p."""' in src
    assert "sunroom.sandbox" not in src and "pydantic" not in src
