"""SessionOptions: one checked record of a session's options, and sessions built from it."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from sunroom import AsyncSession, Session, SessionOptions, Template
from sunroom.errors import UsageError
from sunroom.providers import ScriptedModel
from tests.agent.conftest import code

FAST = "subprocess"


def test_the_options_are_the_session_keywords_one_for_one() -> None:
    def shape(cls: type) -> list[tuple[str, object, object]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]

    assert shape(SessionOptions) == shape(AsyncSession)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"preset": "nope"}, "preset must be one of"),
        ({"max_turns": 0}, "max_turns must be a positive int"),
        ({"max_output_chars": -1}, "max_output_chars must be a positive int"),
        ({"max_depth": 0}, "max_depth must be an int >= 1"),
        ({"hooks": object()}, "hooks must be a sunroom.agent.Hooks"),
        ({"session_id": ""}, "session_id must be a non-empty str"),
    ],
)
def test_invalid_options_are_refused_as_the_session_refuses_them(
    bad: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        SessionOptions(model="fake:x", **bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=message):
        Session(model="fake:x", **bad)  # type: ignore[arg-type]


def test_options_are_frozen_and_keep_the_functions_as_a_tuple() -> None:
    def double(x: int) -> int:
        return 2 * x

    options = SessionOptions(model="fake:x", functions=iter([double]))
    assert options.functions == (double,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_turns = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        SessionOptions("fake:x")  # type: ignore[call-arg]  # keyword-only


def test_the_sync_twin_refuses_a_template_before_starting_anything() -> None:
    options = SessionOptions(model="fake:x", template=Template(setup="x = 1", backend=FAST))
    with pytest.raises(UsageError, match="a Template belongs to the event loop it was made on"):
        Session.from_options(options)


@pytest.mark.kernel
async def test_a_session_from_options_runs_like_one_from_keywords() -> None:
    options = SessionOptions(
        model=ScriptedModel([code("print(6 * 7)"), "It is 42."]),
        backend=FAST,
        session_id="from-options",
        max_turns=3,
    )
    async with AsyncSession.from_options(options) as s:
        result = await s.run("What is 6 * 7?")
        assert result.ok and result.output == "It is 42."
        assert s.session_id == "from-options"
        fork = await s.fork()  # a fork is built from the same options, with a new id
        try:
            assert fork.parent_id == "from-options" and fork.session_id != s.session_id
            assert fork.preset == s.preset and fork.limits == s.limits
        finally:
            await fork.aclose()


@pytest.mark.kernel
def test_the_sync_twin_from_options_runs_too() -> None:
    options = SessionOptions(model=ScriptedModel([code("x = 1"), "done"]), backend=FAST)
    with Session.from_options(options) as s:
        assert s.run("set x").ok
