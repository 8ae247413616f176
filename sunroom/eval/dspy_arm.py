"""The ``dspy-rlm`` arm: DSPy's own ``dspy.RLM`` on the same models and tasks as sunroom's.

``dspy.RLM("context, query -> answer")`` runs with sunroom's DSPy interpreter
(:class:`~sunroom.integrations.dspy.SunroomInterpreter`, a kernel on the evaluation's backend)
and with sunroom's own model objects as its LMs: :class:`SunroomEngine` is a DSPy 3.4 custom
engine (``dspy.LM(..., engine=...)``: ``complete(Request) -> Response``) that sends each
DSPy call to a :class:`~sunroom.providers.Model` on the evaluation's event loop. So the two
RLM implementations get identical work, identical models (the same objects, the same
timing) and the same kernel backend; only the program around the model differs.

``dspy.RLM`` is synchronous: it runs in a worker thread while the event loop serves its model
calls. Its iterations are ``max_turns``, its sub-calls (``llm_query``) at most the budget's
``max_model_calls`` (50 without one); tokens and cost are those of every call through the two
engines (None when a price is unknown). The context is an input variable of the interpreter,
never in the prompt (DSPy shows the model a preview of it, as it does with any interpreter).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Final

from sunroom import extras

extras.require("dspy", "the dspy-rlm arm")

import dspy  # noqa: E402  (after the extra is checked)
from dspy import lm15  # noqa: E402

from sunroom.agent.calls import NodeSpend  # noqa: E402
from sunroom.eval.arms import ArmConfig, ModelClock, TimedModel, run_record  # noqa: E402
from sunroom.eval.results import Run  # noqa: E402
from sunroom.eval.tasks import Task, score  # noqa: E402
from sunroom.integrations.dspy import SunroomInterpreter  # noqa: E402
from sunroom.providers import (  # noqa: E402
    AssistantMessage,
    Message,
    Model,
    Request,
    Settings,
    SystemMessage,
    UserMessage,
)

__all__ = ["SunroomEngine", "run_dspy_rlm"]

_DEFAULT_SUB_CALLS: Final = 50


def _text(parts: object) -> str:
    if isinstance(parts, str):
        return parts
    return "".join(str(getattr(p, "text", "") or "") for p in parts or ())  # type: ignore[attr-defined]


class SunroomEngine:
    """A DSPy custom engine that answers with a sunroom model, on the loop that owns it.

    Called from a worker thread (``dspy.RLM`` is synchronous); the call runs on *loop*.
    Counts ``calls``, and tokens and cost in ``spend`` (its ``cost_micro_usd`` None once any
    call's price was unknown).
    """

    def __init__(
        self, model: Model, loop: asyncio.AbstractEventLoop, *, timeout_s: float | None
    ) -> None:
        self.model = model
        self.loop = loop
        self.timeout_s = timeout_s
        self.calls = 0
        self.spend = NodeSpend()
        self._lock = threading.Lock()

    def _request(self, request: lm15.Request) -> Request:
        messages: list[Message] = []
        if request.system:
            messages.append(SystemMessage(_text(request.system)))
        for message in request.messages:
            text = _text(message.parts)
            if message.role == "assistant":
                messages.append(AssistantMessage(text))
            elif message.role == "system":
                messages.append(SystemMessage(text))
            else:
                messages.append(UserMessage(text))
        return Request(messages, settings=Settings(timeout=self.timeout_s))

    def complete(self, request: lm15.Request) -> lm15.Response:
        """One DSPy call answered by the sunroom model (raises what the model raises)."""
        future = asyncio.run_coroutine_threadsafe(
            self.model.complete(self._request(request)), self.loop
        )
        response = future.result()
        with self._lock:
            self.calls += 1
            self.spend.add(response)
        return lm15.Response(
            id=None,
            model=request.model,
            message=lm15.Message(role="assistant", parts=(lm15.TextPart(text=response.text),)),
            finish_reason="stop" if response.finish_reason in ("stop", "tool_use") else "length",
            usage=lm15.Usage(
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
            ),
        )


def _solve(task: Task, root: SunroomEngine, sub: SunroomEngine, config: ArmConfig) -> object:
    """``dspy.RLM`` on *task* (run in a worker thread); its prediction."""
    backend = str(config.backend)
    budget = config.budget
    sub_calls = budget.max_model_calls if budget and budget.max_model_calls else _DEFAULT_SUB_CALLS
    rlm = dspy.RLM(
        "context, query -> answer",
        max_iters=config.max_turns,
        max_llm_calls=sub_calls,
        sub_lm=dspy.LM(f"sunroom/{sub.model.name}", engine=sub, cache=False),
        interpreter_factory=lambda: SunroomInterpreter(backend=backend),
    )
    lm = dspy.LM(f"sunroom/{root.model.name}", engine=root, cache=False)
    with dspy.context(lm=lm):
        return rlm(context=task.context, query=f"{task.question} {task.answer_format}")


async def run_dspy_rlm(task: Task, model: Model, sub_model: Model, config: ArmConfig) -> Run:
    """The ``dspy-rlm`` arm on *task*; a failure is a run with ``error`` set (score 0)."""
    if not isinstance(config.backend, str):
        return run_record(task, "dspy-rlm", error="the dspy-rlm arm needs a backend given by name")
    clock = ModelClock()
    loop = asyncio.get_running_loop()
    root = SunroomEngine(TimedModel(model, clock), loop, timeout_s=config.timeout_s)
    sub = SunroomEngine(TimedModel(sub_model, clock), loop, timeout_s=config.timeout_s)
    start = time.perf_counter()
    error: str | None = None
    answer = ""
    try:
        prediction = await asyncio.to_thread(_solve, task, root, sub, config)
        answer = str(getattr(prediction, "answer", "") or "")
    except Exception as exc:  # a failed run is recorded with its reason, like the other arms
        error = f"{type(exc).__name__}: {exc}"[:500]
    wall = time.perf_counter() - start
    mine, theirs = root.spend, sub.spend
    cost = None if mine.cost_micro_usd is None or theirs.cost_micro_usd is None else (
        mine.cost_micro_usd + theirs.cost_micro_usd
    )  # fmt: skip
    return run_record(
        task,
        "dspy-rlm",
        score=0.0 if error else score(task, answer),
        answer=answer[:300],
        status="error" if error else "success",
        input_tokens=mine.input_tokens + theirs.input_tokens,
        output_tokens=mine.output_tokens + theirs.output_tokens,
        cost_micro_usd=cost,
        model_calls=root.calls + sub.calls,
        sub_calls=sub.calls,
        wall_s=wall,
        model_s=clock.busy_s,
        error=error,
    )
