"""SunroomInterpreter against DSPy's CodeInterpreter protocol, on real kernels.

DSPy's own interpreter tests (run against this class in a session, not here) are the external
proof; these are sunroom's, written for the same protocol: what ``execute`` returns and
raises, tools on the host, the session's end, and variables sent once per content, counted on
the wire. ``dspy.RLM``, ``ProgramOfThought`` and ``CodeAct`` run end to end against DSPy's
``DummyLM`` (a scripted LM: the only fake).
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Iterator
from typing import Any

import dspy
import pytest
from dspy.primitives.code_interpreter import (
    CodeExecutionError,
    CodeInterpreter,
    CodeInterpreterError,
    FinalOutput,
)
from dspy.utils.dummies import DummyLM

from sunroom.integrations.dspy import SunroomInterpreter
from sunroom.sandbox.sync import Kernel
from tests.integrations.wire import WireCounter

pytestmark = pytest.mark.kernel

MARKER: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")


@pytest.fixture
def interp() -> Iterator[SunroomInterpreter]:
    interpreter = SunroomInterpreter()
    try:
        yield interpreter
    finally:
        interpreter.shutdown()


# -- what execute returns ------------------------------------------------------------------


def test_it_is_a_code_interpreter_and_start_is_idempotent(interp: SunroomInterpreter) -> None:
    assert isinstance(interp, CodeInterpreter)
    assert _kernel_of(interp) is None  # nothing runs before start
    interp.start()
    kernel = _kernel_of(interp)
    assert kernel is not None and kernel.running
    interp.start()
    assert _kernel_of(interp) is kernel and kernel.restarts == 0


def test_execute_starts_lazily_and_keeps_state(interp: SunroomInterpreter) -> None:
    assert interp.execute("x = 20") is None
    assert interp.execute("print(x + 1)") == "21"
    assert interp.execute("x * 2") == 40  # a trailing expression's value, not its repr
    assert interp.execute("[x, {'k': None}]") == [20, {"k": None}]


def test_submit_returns_final_output_shaped_by_output_fields(interp: SunroomInterpreter) -> None:
    assert interp.execute("SUBMIT(6 * 7)") == FinalOutput({"output": 42})
    interp.output_fields = [{"name": "name", "type": "str"}, {"name": "count", "type": "int"}]
    assert interp.execute('SUBMIT("bob", count=3)') == FinalOutput({"name": "bob", "count": 3})
    with pytest.raises(CodeExecutionError, match="TypeError"):
        interp.execute('SUBMIT(name="bob")')


def test_code_errors_are_recoverable_and_syntax_errors_are_syntax_errors(
    interp: SunroomInterpreter,
) -> None:
    interp.execute("kept = 1")
    with pytest.raises(SyntaxError, match="never closed"):
        interp.execute("def broken(")
    with pytest.raises(CodeExecutionError, match="NameError: name 'missing' is not defined"):
        interp.execute("missing")
    with pytest.raises(CodeExecutionError, match="ZeroDivisionError"):
        interp.execute("1 / 0")
    assert interp.execute("kept") == 1  # the session survived all three


def test_invalid_variable_names_are_refused(interp: SunroomInterpreter) -> None:
    for name in ("not-an-identifier", "class", "SUBMIT"):
        with pytest.raises(CodeInterpreterError, match="Invalid variable name"):
            interp.execute("1", {name: 1})


# -- tools run on the host -------------------------------------------------------------------


def test_tools_are_called_on_the_host_by_keyword_or_position(interp: SunroomInterpreter) -> None:
    calls: list[tuple[str, int]] = []

    def record(label: str, times: int = 1) -> dict[str, Any]:
        """Record a call."""
        calls.append((label, times))
        return {"label": label * times, "pid": os.getpid()}

    interp.tools["record"] = record
    assert interp.execute("record('a', times=2)") == {"label": "aa", "pid": os.getpid()}
    assert interp.execute("record(label='b')['label']") == "b"
    assert interp.execute("record.__doc__") == "Record a call."
    assert calls == [("a", 2), ("b", 1)]


def test_tools_changed_between_executions_are_sent_again(interp: SunroomInterpreter) -> None:
    interp.tools["first"] = lambda: "one"
    assert interp.execute("first()") == "one"
    interp.tools.clear()
    interp.tools["second"] = lambda: "two"
    assert interp.execute("second()") == "two"
    with pytest.raises(CodeExecutionError, match="NameError"):
        interp.execute("first()")


def test_a_tool_error_is_the_code_s_error(interp: SunroomInterpreter) -> None:
    def fail(reason: str) -> str:
        raise ValueError(reason)

    interp.tools["fail"] = fail
    with pytest.raises(CodeExecutionError, match="ValueError: no luck"):
        interp.execute("fail('no luck')")
    assert (
        interp.execute("try:\n    fail('x')\nexcept ValueError:\n    print('caught')") == "caught"
    )


def test_async_tools_and_the_caller_s_context_reach_the_tool(interp: SunroomInterpreter) -> None:
    async def tagged(text: str) -> str:
        return f"{MARKER.get()}:{text}"

    interp.tools["tagged"] = tagged
    token = MARKER.set("caller")
    try:
        assert interp.execute("tagged('hi')") == "caller:hi"
    finally:
        MARKER.reset(token)


# -- the session's end -----------------------------------------------------------------------


def test_a_dead_kernel_ends_the_session_and_is_never_restarted(interp: SunroomInterpreter) -> None:
    interp.execute("state = 'precious'")
    kernel = interp.kernel
    assert kernel is not None
    with pytest.raises(CodeInterpreterError, match="died") as died:
        interp.execute("import os\nos._exit(9)")
    assert not isinstance(died.value, CodeExecutionError)
    assert not kernel.running and _kernel_of(interp) is None  # closed, not started afresh
    for call in (lambda: interp.execute("state"), interp.start):
        with pytest.raises(CodeInterpreterError, match="shut down"):
            call()


def test_a_kernel_that_cannot_start_is_an_interpreter_error() -> None:
    interpreter = SunroomInterpreter(backend="no-such-backend")
    with pytest.raises(CodeInterpreterError, match="did not start: unknown backend"):
        interpreter.start()


def test_shutdown_is_idempotent_and_final() -> None:
    interpreter = SunroomInterpreter()
    interpreter.execute("1")
    interpreter.shutdown()
    interpreter.shutdown()
    with pytest.raises(CodeInterpreterError, match="shut down"):
        interpreter.execute("1")


# -- variables: once per content ------------------------------------------------------------


def test_a_variable_crosses_once_per_content(interp: SunroomInterpreter) -> None:
    wire = WireCounter(interp)
    context = "x" * 4_000_000
    assert interp.execute("len(context)", {"context": context}) == 4_000_000
    first = wire.sent
    assert context.count("x") * 1 <= first <= len(context) + 20_000
    for _ in range(5):
        assert interp.execute("context[:3]", {"context": context}) == "xxx"
    assert wire.sent - first < 20_000  # five more executions: no copy of the context
    changed = context + "y"
    assert interp.execute("context[-1]", {"context": changed}) == "y"
    assert wire.sent - first > len(changed)  # new content is sent


def test_each_execution_sees_the_values_as_passed(interp: SunroomInterpreter) -> None:
    items = [1, 2, 3]
    interp.execute("items.append(4)\ntext = text.upper()", {"items": items, "text": "abc"})
    assert interp.execute("[items, text]", {"items": items, "text": "abc"}) == [[1, 2, 3], "abc"]
    assert items == [1, 2, 3]  # the host's value is never touched
    assert interp.execute("sorted(tags)", {"tags": {"b", "a"}}) == ["a", "b"]


# -- DSPy's modules, end to end ------------------------------------------------------------


def _kernel_of(interpreter: SunroomInterpreter) -> Kernel | None:
    return interpreter.kernel


def _scripted(responses: list[dict[str, Any]]) -> DummyLM:
    return DummyLM(responses)


def test_rlm_runs_over_a_bound_context_with_llm_query() -> None:
    context = "".join(f"line {i}: {'needle' if i == 4321 else 'hay'}\n" for i in range(20_000))
    counters: list[WireCounter] = []

    def factory() -> SunroomInterpreter:
        interpreter = SunroomInterpreter()
        counters.append(WireCounter(interpreter))
        return interpreter

    lm = _scripted(
        [
            {"reasoning": "Look at the size", "code": "print(len(context.splitlines()))"},
            {
                "reasoning": "Find the needle and ask",
                "code": (
                    "hit = [l for l in context.splitlines() if 'needle' in l][0]\n"
                    "print(hit)\nprint(llm_query('where is it? ' + hit))"
                ),
            },
            {"answer": "sub-answer"},  # llm_query's reply
            {"reasoning": "Done", "code": "SUBMIT(hit.split(':')[0])"},
        ]
    )
    rlm = dspy.RLM("context, query -> answer", max_iters=5, interpreter_factory=factory)
    with dspy.context(lm=lm):
        result = rlm(context=context, query="where is the needle?")
    assert result.answer == "line 4321"
    outputs = [step["output"] for step in result.trajectory]
    assert outputs[0].strip() == "20000"
    assert "line 4321: needle" in outputs[1] and "sub-answer" in outputs[1]
    (wire,) = counters
    assert len(context) <= wire.sent <= 1.05 * len(context)  # three iterations, one copy


@pytest.mark.filterwarnings("ignore:.* is deprecated and will be removed:DeprecationWarning")
def test_program_of_thought_and_code_act_run_on_it() -> None:
    pot = dspy.ProgramOfThought("question -> answer", interpreter_factory=SunroomInterpreter)
    lm = _scripted(
        [
            {
                "reasoning": "sum",
                "generated_code": "```python\nSUBMIT({'answer': sum(range(5))})\n```",
            },
            {"reasoning": "it ran", "answer": "10"},
        ]
    )
    with dspy.context(lm=lm):
        assert pot(question="sum of 0..4?").answer == "10"

    act = dspy.CodeAct("n: int -> doubled: int", tools=[double], interpreter_factory=_factory())
    lm = _scripted(
        [
            {"generated_code": "```python\nprint(double(21))\n```", "finished": True},
            {"reasoning": "done", "doubled": "42"},
        ]
    )
    with dspy.context(lm=lm):
        result = act(n=21)
    assert result.doubled == 42
    assert result.trajectory["code_output_0"] == '"42"'


def double(n: int) -> int:
    """Double n (CodeAct defines it inside the kernel from this source)."""
    return 2 * n


def _factory() -> Callable[[], SunroomInterpreter]:
    return lambda: SunroomInterpreter()
