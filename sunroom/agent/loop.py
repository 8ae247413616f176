"""The agent loop of one session: model turn → cells → output back, to a terminal result.

:class:`Loop` holds the transcript. ``run`` is one run: before each model call it adds pending
user and steering messages and lets the context guard warn or compact; a reply's
``execute_code`` calls (or, without a tool call, its ```python blocks) run in the kernel and
their redacted, truncated output goes back to the model. The run ends with the first terminal
condition: an accepted submit (after the cell that made it), a final text answer (when no
submit is required), the turn limit, a spent budget, a wall-time timeout, a model error (a
``ProviderError``), a reply cut off by the output-token limit (never retried), cancellation,
or an internal error: any other exception is a bug (in sunroom, a hook or a custom model), so
it is logged with its traceback and the run ends ``internal_error``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, final

from sunroom import tracing
from sunroom.agent import events as ev
from sunroom.agent.calls import ModelGate, Publish
from sunroom.agent.guard import Guard
from sunroom.agent.hooks import Hooks, ask
from sunroom.agent.images import IMAGES_INTRO, ImageBudget, TurnImages
from sunroom.agent.live import LiveOutput
from sunroom.agent.presets import EXECUTE_TOOL, extract_code, render_result, truncate
from sunroom.agent.result import RunResult, Status
from sunroom.agent.submit import Submission
from sunroom.errors import BudgetExceededError, KernelError, ProviderError
from sunroom.providers import (
    AssistantMessage,
    Message,
    Model,
    Request,
    Response,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from sunroom.sandbox.kernel import AsyncKernel

__all__ = ["Loop", "LoopConfig"]

log = logging.getLogger("sunroom.agent")

_NUDGE: Final = (
    "You have not submitted an answer yet. When you have it, call submit(...) from a code "
    "cell; the run ends when that cell finishes."
)


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class LoopConfig:
    """Everything a loop uses, owned by its session."""

    model: Model
    kernel: AsyncKernel
    gate: ModelGate
    publish: Publish
    guard: Guard
    submission: Submission
    hooks: Hooks | None
    max_turns: int
    max_output_chars: int
    tool: bool
    needs_submit: bool
    sub_session: bool
    reinstall: Callable[[], Awaitable[None]]
    live: LiveOutput
    images: ImageBudget = ImageBudget()
    end_event: type[ev.SessionEnded | ev.BranchEnded] = ev.SessionEnded
    agent: str = "sunroom"
    """The agent's name in traces (``gen_ai.agent.name``): the session's preset."""


@dataclass(slots=True)
class _Outcome:
    status: Status
    output: object = None
    error: str | None = None


@final
class Loop:
    """The transcript and the run loop of one session (one run at a time)."""

    def __init__(self, config: LoopConfig, *, system: str) -> None:
        self.c = config
        self.messages: list[Message] = [SystemMessage(system)]
        self._pending: list[Message] = []
        self._images = TurnImages(config.images)

    def steer(self, text: str, *, interrupt: bool) -> None:
        """Queue a user message (or an interrupt) for the next model call."""
        body = self.c.guard.redact(text)
        if interrupt:
            body = f"[Interrupt from the user] {body}"
        self._pending.append(UserMessage(body))

    async def run(self, session_id: str) -> RunResult:
        """One run to its terminal result; never raises (cancellation becomes ``cancelled``).

        The run is an ``invoke_agent`` span (:mod:`sunroom.tracing`): its model calls and cells
        are its children; it links to the fork its kernel came from; a result other than
        ``success`` sets it to ERROR with the status as the error type.
        """
        c = self.c
        with tracing.agent_span(
            agent=c.agent, model=c.model, conversation_id=session_id, links=c.kernel.trace_links
        ) as span:
            result = await self._run(session_id)
            tracing.record_run(
                span,
                status=result.status,
                turns=result.turns,
                input_tokens=result.usage.input_tokens,
                output_tokens=result.usage.output_tokens,
            )
        return result

    async def _run(self, session_id: str) -> RunResult:
        c = self.c
        start = c.gate.tracker.snapshot()
        turns = 0
        outcome: _Outcome
        try:
            while True:
                if turns >= c.max_turns:
                    outcome = _Outcome("max_turns", error=f"no answer after {c.max_turns} turns")
                    break
                self.messages.extend(self._pending)
                self._pending.clear()
                tools = (EXECUTE_TOOL,) if c.tool else ()
                await c.guard.fit(
                    self.messages, tools=tools, gate=c.gate, model=c.model, publish=c.publish
                )
                response = await c.gate.complete(
                    c.model, Request(self.messages, tools=tools), sub_call=c.sub_session
                )
                turns += 1
                found = await self._turn(turns, response)
                c.publish(ev.TurnEnded, turn=turns)
                if found is not None:
                    outcome = found
                    break
        except BudgetExceededError as exc:
            status: Status = "timeout" if exc.limit == "wall_time" else "budget_exceeded"
            outcome = _Outcome(status, error=str(exc))
        except asyncio.CancelledError:
            outcome = _Outcome("cancelled", error="the run was cancelled")
        except KernelError as exc:
            outcome = _Outcome("cancelled", error=f"the kernel failed: {exc}")
        except ProviderError as exc:
            outcome = _Outcome("model_error", error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("session %s: the run failed unexpectedly", session_id)
            outcome = _Outcome(
                "internal_error", error=f"internal error: {type(exc).__name__}: {exc}"
            )
        if outcome.error is not None:
            outcome.error = c.guard.redact(outcome.error)
            if outcome.status in ("model_error", "cancelled", "internal_error"):
                c.publish(ev.SessionError, message=outcome.error)
        spend = c.gate.tracker.snapshot().since(start)
        result = RunResult(
            status=outcome.status,
            output=outcome.output,
            usage=spend.usage,
            cost_micro_usd=spend.cost_micro_usd if spend.cost_known else None,
            turns=turns,
            model_calls=spend.model_calls,
            sub_calls=spend.sub_calls,
            session_id=session_id,
            error=outcome.error,
        )
        c.publish(c.end_event, result=result)
        return result

    async def _turn(self, turn: int, response: Response) -> _Outcome | None:
        c = self.c
        message = response.message
        self.messages.append(message)
        for part in message.thinking:
            if part.text:
                c.publish(ev.Thinking, turn=turn, text=part.text)
        if message.text:
            c.publish(ev.AssistantText, turn=turn, text=message.text)
        if response.finish_reason in ("length", "content_filter", "error"):
            self._answer_calls(message, "not run: the reply was cut off")
            if response.finish_reason == "length":
                return _Outcome("length", error="the model's reply hit its output-token limit")
            return _Outcome(
                "model_error", error=f"the model stopped with {response.finish_reason!r}"
            )
        self._images = TurnImages(c.images, c.model.accepts_images)
        if message.tool_calls:
            for call in message.tool_calls:
                content, is_error = await self._tool(turn, call)
                self.messages.append(
                    ToolResultMessage(call.id, content, is_error=is_error, name=call.name)
                )
            if self._images.parts:
                self.messages.append(UserMessage([IMAGES_INTRO, *self._images.parts]))
        else:
            code = extract_code(message.text)
            if code is not None:
                content, _ = await self._cell(turn, code, "fenced")
                text = f"Output of your code:\n{content}"
                self.messages.append(UserMessage([text, *self._images.parts]))
            elif not c.submission.accepted:
                if not c.needs_submit:
                    return _Outcome("success", output=c.guard.redact(message.text))
                self.messages.append(UserMessage(_NUDGE))
        if c.submission.accepted:
            return _Outcome("success", output=c.submission.value)
        if c.gate.tracker.exceeded is not None:
            raise c.gate.tracker.exceeded
        return None

    def _answer_calls(self, message: AssistantMessage, text: str) -> None:
        for call in message.tool_calls:
            self.messages.append(ToolResultMessage(call.id, text, is_error=True, name=call.name))

    async def _tool(self, turn: int, call: ToolCall) -> tuple[str, bool]:
        if self.c.submission.accepted:
            return "skipped: an answer was already submitted", True
        if call.name != EXECUTE_TOOL.name:
            return f"unknown tool {call.name!r}; the only tool is {EXECUTE_TOOL.name}", True
        code = call.arguments.get("code")
        if not isinstance(code, str):
            if call.raw_arguments is not None:
                return "the arguments were not a JSON object with a 'code' string", True
            return "execute_code needs a 'code' argument (a string of Python)", True
        return await self._cell(turn, code, "tool")

    async def _cell(self, turn: int, code: str, via: str) -> tuple[str, bool]:
        c = self.c
        c.publish(ev.CodeSubmitted, turn=turn, code=code, via=via)
        veto = await ask(c.hooks.before_execute if c.hooks else None, code)
        if veto is not None:
            text = f"vetoed: {c.guard.redact(veto.reason)}"
            c.publish(ev.Vetoed, what="execute", reason=veto.reason)
            c.publish(
                ev.ExecutionFinished,
                turn=turn,
                status="vetoed",
                output=text,
                truncated_chars=0,
                truncated_bytes=0,
                duration_s=0.0,
                state_lost=False,
            )
            return text, True
        timeout = c.kernel.limits.timeout_s
        remaining = c.gate.tracker.remaining_wall()
        if remaining is not None:
            c.gate.tracker.check()
            timeout = max(0.01, min(timeout, remaining))
        c.live.begin(turn, code)
        try:
            result = await c.kernel.execute(code, timeout_s=timeout)
        finally:
            c.live.end()  # its last chunks go before ExecutionFinished
        if result.state_lost:
            await c.reinstall()
        rendered = render_result(result)
        if result.outputs or result.dropped_outputs:
            lines = self._images.take(result.outputs, result.dropped_outputs)
            rendered = (
                "\n".join([rendered, *lines]) if rendered != "(no output)" else "\n".join(lines)
            )
        shown, cut = truncate(c.guard.redact(rendered), c.max_output_chars)
        c.publish(
            ev.ExecutionFinished,
            turn=turn,
            status=result.status,
            output=shown,
            truncated_chars=cut,
            truncated_bytes=result.truncated_bytes,
            duration_s=result.duration_s,
            state_lost=result.state_lost,
            outputs=tuple(item.to_dict() for item in result.outputs),
        )
        return shown, not result.ok
