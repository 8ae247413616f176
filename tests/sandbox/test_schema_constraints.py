"""Host functions with constrained parameter types, called from a real kernel.

The host is the authority: pydantic validates every argument against the declared constraints
before the function runs. The kernel sees the same constraints (rendered from the functions'
JSON Schema into ``Annotated[..., Schema(...)]`` on its wrappers and mirrors), so ``help()``, a prompt
and ``predict(output=...)`` see what the host will enforce.
"""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic

from sunroom import AsyncKernel

FAST = "subprocess"


class Guest(pydantic.BaseModel):
    """A guest."""

    name: str = pydantic.Field(min_length=1, max_length=10)
    age: int = pydantic.Field(ge=0, le=150)


calls: list[str] = []


def book(
    guest: Guest,
    code: Annotated[str, pydantic.Field(pattern=r"^[A-Z]{3}$")],
    seats: Annotated[int, pydantic.Field(gt=0)] = 1,
    kind: Literal["economy", "business"] = "economy",
    tags: Annotated[list[str], pydantic.Field(min_length=1)] = ["x"],  # noqa: B006
) -> Guest:
    """Book seats for a guest."""
    calls.append(guest.name)
    return guest


async def test_constrained_parameters_refuse_bad_arguments_in_the_kernel() -> None:
    calls.clear()
    async with AsyncKernel(backend=FAST, functions=[book]) as k:
        bad = {
            "book(Guest(name='A', age=-5), 'ABC')": "guest.age: Input should be greater than or equal to 0",
            "book(Guest(name='', age=5), 'ABC')": "guest.name: String should have at least 1 character",
            "book(Guest(name='A', age=5), 'abc')": "code: String should match pattern '^[A-Z]{3}$'",
            "book(Guest(name='A', age=5), 'ABC', seats=0)": "seats: Input should be greater than 0",
            "book(Guest(name='A', age=5), 'ABC', kind='first')": "kind: Input should be 'economy' or 'business'",
            "book(Guest(name='A', age=5), 'ABC', tags=[])": "tags: List should have at least 1 item",
        }
        for cell, expected in bad.items():
            r = await k.execute(cell)
            assert r.error is not None and r.error.type == "HostFunctionArgumentError", (cell, r)
            assert expected in r.error.message, (cell, r.error.message)
        assert calls == []
        r = await k.execute(
            "g = book(Guest(name='Ann', age=30), 'ABC', seats=2)\n(type(g).__name__, g.age)"
        )
        assert r.ok and r.value == "('Guest', 30)", r
        assert calls == ["Ann"]


async def test_the_kernel_sees_the_constraints_the_host_enforces() -> None:
    async with AsyncKernel(backend=FAST, functions=[book]) as k:
        r = await k.execute(
            "import inspect, typing\n"
            "sig = inspect.signature(book)\n"
            "print(sig.parameters['code'].annotation)\n"
            "print(sig.parameters['seats'].annotation)\n"
            "print(typing.get_type_hints(Guest, include_extras=True)['age'])\n"
        )
        assert r.ok, r
        lines = r.stdout.splitlines()
        assert lines[0] == "typing.Annotated[str, Schema(pattern='^[A-Z]{3}$')]"
        assert lines[1] == "typing.Annotated[int, Schema(exclusiveMinimum=0)]"
        assert lines[2] == "typing.Annotated[int, Schema(maximum=150, minimum=0)]"
