"""The arms of an evaluation: one way of answering a task with a model, measured the same way.

* ``long-prompt``: one ``Model.complete`` with the whole context in the prompt.
* ``rlm-no-sub``: an ``AsyncSession(preset="rlm")`` with the context bound as the kernel
  variable ``context`` (never in the prompt), whose ``predict``/``predict_many`` are refused:
  a ``before_host_call`` hook vetoes them (the call raises ``PermissionError`` in the kernel
  and no model is called) and the system prompt says so (:data:`NO_SUB_NOTE`). The model
  solves the task with code alone. The kernel still defines the two functions (a session
  always does); the veto is what makes the arm honest, the note what makes it fair.
* ``rlm``: the same session with ``predict``/``predict_many`` answered by the sub-model.
* ``best-of-k``: the ``rlm`` session run with ``branches=k``: k candidate programs, each in a
  fork of the kernel, and the answer picked by ``choose`` (``vote`` or ``first``). Tokens,
  cost and sub-calls are those of every branch.
* ``dspy-rlm``: DSPy's own ``dspy.RLM`` on the same models, through sunroom's DSPy
  interpreter (:mod:`sunroom.eval.dspy_arm`; needs the ``dspy`` extra).

:func:`sunroom.eval.runner.run_arm` picks the function of an arm. Every arm returns a
:class:`~sunroom.eval.results.Run`. Time is measured on the host: ``wall_s`` is the run (for
sessions: from ``run()`` to its result; the kernel's start is ``startup_s``), ``model_s`` the
time at least one model call (root or sub) was in flight (:class:`ModelClock`), and
``overhead_s = wall_s - model_s``: what sunroom itself took (kernel, channel, host functions,
the session's bookkeeping), see docs/eval.md.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from sunroom.agent import AsyncSession, Budget
from sunroom.agent.hooks import Hooks, Veto
from sunroom.eval.results import Run
from sunroom.eval.tasks import Task, score
from sunroom.providers import Model, Request, Response, Settings, UserMessage
from sunroom.providers.events import StreamEvent
from sunroom.sandbox.backend import Backend

__all__ = [
    "ARMS",
    "NO_SUB_NOTE",
    "ArmConfig",
    "ModelClock",
    "TimedModel",
    "long_prompt",
    "rlm_task",
    "run_record",
    "run_session",
]

ARMS: Final = ("long-prompt", "rlm-no-sub", "rlm", "best-of-k", "dspy-rlm")
"""Every arm, in the order tables list them."""

NO_SUB_NOTE: Final = (
    "In this run predict and predict_many are disabled (calling them raises PermissionError): "
    "solve the task with code alone."
)
"""What the ``rlm-no-sub`` arm appends to the system prompt."""

_ANSWER_CHARS: Final = 300
"""How much of an answer a run keeps (for reading failures, not for scoring)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArmConfig:
    """What every run of an evaluation shares: kernel backend, budget, turns, best-of-k."""

    backend: str | Backend = "bwrap"
    budget: Budget | None = None
    max_turns: int = 20
    timeout_s: float | None = 600.0
    k: int = 3
    choose: Literal["first", "vote"] = "vote"
    embeddings: object = None
    """An :class:`~sunroom.embeddings.OnnxEmbedder` for ``niah-semantic`` (or None)."""
    code_tool: bool = True
    """Sessions offer the ``execute_code`` tool (False: fenced code blocks, for models without
    tool calling)."""


class ModelClock:
    """The time during which at least one model call of a run was in flight (overlaps once)."""

    def __init__(self) -> None:
        self.busy_s = 0.0
        self._in_flight = 0
        self._since = 0.0

    def enter(self) -> None:
        """A call starts."""
        if self._in_flight == 0:
            self._since = time.perf_counter()
        self._in_flight += 1

    def leave(self) -> None:
        """A call ended (returned or raised)."""
        self._in_flight -= 1
        if self._in_flight == 0:
            self.busy_s += time.perf_counter() - self._since


class TimedModel(Model):
    """*inner*, with every call timed on *clock*; closing it leaves *inner* open (shared)."""

    def __init__(self, inner: Model, clock: ModelClock) -> None:
        self.inner = inner
        self.clock = clock
        self.name = inner.name
        self.accepts_images = inner.accepts_images

    async def complete(self, request: Request) -> Response:
        """The inner model's reply, timed."""
        self.clock.enter()
        try:
            return await self.inner.complete(request)
        finally:
            self.clock.leave()

    async def stream(self, request: Request) -> AsyncIterator[StreamEvent]:
        """The inner model's events, timed until the last one."""
        self.clock.enter()
        try:
            async for event in self.inner.stream(request):
                yield event
        finally:
            self.clock.leave()

    async def count_tokens(self, request: Request) -> int:
        """The inner model's count (not timed: it is not a model call)."""
        return await self.inner.count_tokens(request)


def long_prompt(task: Task) -> str:
    """The ``long-prompt`` arm's prompt: an introduction, the whole context, the question."""
    if task.name in ("niah", "niah-multi"):
        intro = (
            "Special magic numbers are hidden within the following text. Make sure to memorize "
            "them. I will quiz you about them afterwards."
        )
    elif task.name == "niah-semantic":
        intro = "A passcode is hidden within the following text. Read it carefully; I will ask about it afterwards."  # noqa: E501
    elif task.name == "code-qa":
        intro = "Below is Python source code. Read all of it; you will be asked about it."
    else:
        intro = "Below is a list of records. Read all of them; you will be asked about them."
    return f"{intro}\n\n{task.context}\n\n{task.question} {task.answer_format}"


def rlm_task(task: Task) -> str:
    """The task an RLM session is given (the context is the kernel variable ``context``)."""
    what = {
        "code-qa": "Python source code",
        "niah": "text",
        "niah-multi": "text",
        "niah-semantic": "text",
    }.get(task.name, "records (one per line)")
    return (
        f"The variable `context` holds the {what}. {task.question} "
        f"{task.answer_format} Call submit() with the answer."
    )


def run_record(task: Task, arm: str, **fields: object) -> Run:
    """A :class:`Run` of *arm* on *task* with *fields* (the rest from the task or defaults)."""
    return Run.model_validate(
        {
            "task": task.name,
            "length": task.length,
            "seed": task.sample,
            "arm": arm,
            "metric": task.metric,
            "expected": task.expected,
            **fields,
        }
    )


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


async def run_long_prompt(task: Task, model: Model, config: ArmConfig) -> Run:
    """The ``long-prompt`` arm: one call with the context in the prompt."""
    clock = ModelClock()
    timed = TimedModel(model, clock)
    request = Request([UserMessage(long_prompt(task))], settings=Settings(timeout=config.timeout_s))
    start = time.perf_counter()
    try:
        response = await timed.complete(request)
    except Exception as exc:  # a failed call is a failed run, recorded with its reason
        wall = time.perf_counter() - start
        return run_record(task, "long-prompt", wall_s=wall, model_s=clock.busy_s, error=_error(exc))
    wall = time.perf_counter() - start
    text = response.text.strip()
    finished = response.finish_reason in ("stop", "tool_use")
    return run_record(
        task,
        "long-prompt",
        score=score(task, text),
        answer=text[:_ANSWER_CHARS],
        status="success" if finished else response.finish_reason,
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        cost_micro_usd=response.cost_micro_usd,
        model_calls=1,
        wall_s=wall,
        model_s=clock.busy_s,
        error=None if finished else f"the reply ended with {response.finish_reason}",
    )


async def _refuse_sub_calls(name: str, arguments: Mapping[str, object]) -> Veto | None:
    if name in ("predict", "predict_many"):
        return Veto("the rlm-no-sub arm has no sub-model")
    return None


async def run_session(
    task: Task, arm: str, model: Model, sub_model: Model, config: ArmConfig
) -> Run:
    """The ``rlm-no-sub``, ``rlm`` and ``best-of-k`` arms: an RLM session over the context."""
    clock = ModelClock()
    no_sub = arm == "rlm-no-sub"
    branched = arm == "best-of-k"
    start = time.perf_counter()
    started = start
    try:
        async with AsyncSession(
            model=TimedModel(model, clock),
            preset="rlm",
            sub_model=TimedModel(sub_model, clock),
            backend=config.backend,
            inputs={"context": task.context},
            output=None,
            budget=config.budget,
            max_turns=config.max_turns,
            code_tool=config.code_tool,
            hooks=Hooks(before_host_call=_refuse_sub_calls) if no_sub else None,
            system_prompt=NO_SUB_NOTE if no_sub else None,
            embeddings=config.embeddings,  # type: ignore[arg-type]  # an Embedder or None
        ) as session:
            started = time.perf_counter()  # the run itself, not the kernel's start
            result = await session.run(
                rlm_task(task),
                branches=config.k if branched else None,
                choose=config.choose,
            )
    except Exception as exc:  # a session that cannot start or breaks is a failed run
        now = time.perf_counter()
        return run_record(
            task,
            arm,
            wall_s=now - started,
            startup_s=started - start,
            model_s=clock.busy_s,
            error=_error(exc),
        )
    wall = time.perf_counter() - started
    answer = "" if result.output is None else str(result.output)
    return run_record(
        task,
        arm,
        score=score(task, result.output) if result.ok else 0.0,
        answer=answer[:_ANSWER_CHARS],
        status=result.status,
        input_tokens=result.usage.input_tokens,
        output_tokens=result.usage.output_tokens,
        cost_micro_usd=result.cost_micro_usd,
        model_calls=result.model_calls,
        sub_calls=result.sub_calls,
        wall_s=wall,
        startup_s=started - start,
        model_s=clock.busy_s,
        error=None if result.ok else f"{result.status}: {result.error}"[:500],
    )
