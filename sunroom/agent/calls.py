"""Where a session's calls pass: :class:`ModelGate` (every model call) and :func:`instrument`.

``ModelGate.complete`` reserves the call against the shared budget, bounds it by the wall-time
budget, records its usage and cost and publishes a ``UsageUpdated`` event. ``instrument`` wraps
a host function so that each call from the kernel is offered to the ``before_host_call`` hook,
reported as ``HostCallStarted``/``HostCallFinished`` (with the model cost it incurred), and
never hands a registered secret to the kernel in an error message.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import contextvars
import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar, final

from sunroom import tracing
from sunroom.agent import events as ev
from sunroom.agent.budget import BudgetTracker
from sunroom.agent.hooks import Hooks, ask
from sunroom.agent.previews import json_preview
from sunroom.agent.trace_content import request_content, response_content
from sunroom.errors import BudgetExceededError
from sunroom.providers import Model, Request, Response
from sunroom.sandbox.functions import HostFunction

__all__ = [
    "CURRENT_CALL",
    "ModelGate",
    "NodeSpend",
    "Publish",
    "Redact",
    "RedactValue",
    "complete_traced",
    "instrument",
    "spending",
]

T = TypeVar("T")


class Publish(Protocol):
    """``publish(EventType, **fields)``: the session's redacting event publisher."""

    def __call__(self, cls: type[ev.Event], /, **fields: object) -> object:
        """Publish one event."""


class RedactValue(Protocol):
    """``redact_value(value)``: *value* with every registered secret replaced in its strings."""

    def __call__(self, value: T, /) -> T:
        """The redacted value (of the same type)."""


Redact = Callable[[str], str]
"""Returns text with every registered secret replaced."""

CURRENT_CALL: contextvars.ContextVar[int] = contextvars.ContextVar("sunroom_call", default=0)
"""The id of the host call being served (0 outside one), for progress events."""

_COSTS: contextvars.ContextVar[list[int | None] | None] = contextvars.ContextVar(
    "sunroom_costs", default=None
)


@final
class NodeSpend:
    """What some model calls spent: tokens and micro-USD (a recursion-tree node, :func:`spending`).

    ``cost_micro_usd`` is None once any call's price was unknown.
    """

    __slots__ = ("cost_micro_usd", "input_tokens", "output_tokens")

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_micro_usd: int | None = 0

    def add(self, response: Response) -> None:
        """Count one reply."""
        self.input_tokens += response.usage.input_tokens
        self.output_tokens += response.usage.output_tokens
        if self.cost_micro_usd is not None and response.cost_micro_usd is not None:
            self.cost_micro_usd += response.cost_micro_usd
        else:
            self.cost_micro_usd = None


_NODE: contextvars.ContextVar[NodeSpend | None] = contextvars.ContextVar(
    "sunroom_node", default=None
)


@contextlib.contextmanager
def spending() -> Iterator[NodeSpend]:
    """Count every model call made in this context, and in the tasks it starts.

    A nested :func:`spending` starts a count of its own: so a sub-call counts its own reply,
    and a nested session its root-model turns, not its children's.
    """
    node = NodeSpend()
    token = _NODE.set(node)
    try:
        yield node
    finally:
        _NODE.reset(token)


@final
class ModelGate:
    """Makes model calls under a shared :class:`BudgetTracker` and reports their usage."""

    def __init__(self, tracker: BudgetTracker, publish: Publish) -> None:
        self.tracker = tracker
        self._publish = publish

    async def complete(self, model: Model, request: Request, *, sub_call: bool) -> Response:
        """Call *model*; raise BudgetExceededError when a limit forbids it or wall time runs out.

        Provider errors propagate unchanged.
        """
        tracker = self.tracker
        try:
            tracker.reserve()
        except BudgetExceededError as exc:
            self._publish(ev.BudgetWarning, limit=exc.limit, message=str(exc))
            raise
        try:
            async with asyncio.timeout(tracker.remaining_wall()) as scope:
                response = await complete_traced(model, request)
        except TimeoutError:
            tracker.release()
            if not scope.expired():
                raise
            spent = BudgetExceededError(
                f"the session's wall-time budget of {tracker.budget.max_wall_s:g} s ran out "
                "during a model call",
                limit="wall_time",
            )
            tracker.exceeded = tracker.exceeded or spent
            self._publish(ev.BudgetWarning, limit=spent.limit, message=str(spent))
            raise spent from None
        except BaseException:
            tracker.release()
            raise
        spend = tracker.record(response, sub_call=sub_call)
        costs = _COSTS.get()
        if costs is not None:
            costs.append(response.cost_micro_usd)
        node = _NODE.get()
        if node is not None:
            node.add(response)
        self._publish(
            ev.UsageUpdated,
            usage=spend.usage,
            model_calls=spend.model_calls,
            cost_micro_usd=spend.cost_micro_usd if spend.cost_known else None,
            sub_call=sub_call,
        )
        return response


async def complete_traced(model: Model, request: Request) -> Response:
    """``model.complete(request)`` inside a ``chat {model}`` span (:mod:`sunroom.tracing`).

    The span records the provider, the model asked and the one that answered, the finish
    reason and the token counts; the request's and the reply's messages only when
    :func:`sunroom.tracing.captures_content` (:mod:`sunroom.agent.trace_content`). Errors
    propagate unchanged.
    """
    with tracing.chat_span(model) as span:
        content = span is not None and tracing.captures_content()
        if content:
            tracing.annotate(span, request_content(request))
        response = await model.complete(request)
        if content:
            tracing.annotate(span, response_content(response))
        usage = response.usage
        tracing.record_response(
            span,
            model=response.model,
            response_id=response.id,
            finish_reason=response.finish_reason,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            reasoning_tokens=usage.reasoning_tokens,
        )
    return response


_ids = itertools.count(1)


def _redacted_exception(exc: Exception, redact: Redact) -> Exception:
    """*exc* again with a redacted message, keeping its type name for the kernel."""
    message = redact(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
    cls = type(exc)
    if getattr(builtins, cls.__name__, None) is cls:
        try:
            same: Exception = cls(message)
            return same
        except Exception:  # a builtin with an unusual constructor (UnicodeDecodeError, ...)
            return RuntimeError(message)
    renamed: Exception = type(cls.__name__, (Exception,), {})(message)  # no host class leaks
    return renamed


def instrument(
    hf: HostFunction,
    *,
    hooks: Hooks | None,
    publish: Publish,
    redact: Redact,
    redact_value: RedactValue | None = None,
) -> HostFunction:
    """A copy of *hf* whose calls are vetted by hooks and reported as events.

    With *redact_value*, the function's result is redacted before it reaches the kernel, so a
    registered secret never enters it (errors are always redacted).
    """
    fn = hf.fn
    is_async = hf.is_async
    name = hf.name

    @functools.wraps(fn)
    async def wrapper(**kwargs: object) -> object:  # functools.wraps replaces both annotations
        call_id = next(_ids)
        veto = await ask(hooks.before_host_call if hooks else None, name, dict(kwargs))
        if veto is not None:
            reason = redact(veto.reason)
            publish(ev.Vetoed, what=name, reason=reason)
            raise PermissionError(f"{name}() was vetoed: {reason}")
        arguments = ev.preview(redact(json_preview(kwargs)))
        publish(ev.HostCallStarted, call_id=call_id, name=name, arguments=arguments)
        costs: list[int | None] = []
        token_call = CURRENT_CALL.set(call_id)
        token_costs = _COSTS.set(costs)
        started = time.perf_counter()
        error: str | None = None
        shown: str | None = None
        try:
            with tracing.tool_span(name=name, call_id=call_id):  # current: predict's chats
                if is_async:
                    result = await fn(**kwargs)
                else:
                    loop = asyncio.get_running_loop()
                    ctx = contextvars.copy_context()
                    result = await loop.run_in_executor(None, lambda: ctx.run(fn, **kwargs))
            clean_result = result if redact_value is None else redact_value(result)
            shown = ev.preview(redact(json_preview(clean_result)))
            return clean_result
        except Exception as exc:
            clean = _redacted_exception(exc, redact)
            error = f"{type(exc).__name__}: {clean}"
            raise clean from None
        finally:
            CURRENT_CALL.reset(token_call)
            _COSTS.reset(token_costs)
            cost: int | None = 0 if None not in costs else None
            if cost is not None:
                cost = sum(c for c in costs if c is not None)
            publish(
                ev.HostCallFinished,
                call_id=call_id,
                name=name,
                duration_s=time.perf_counter() - started,
                cost_micro_usd=cost,
                error=error,
                result=shown,
            )

    return dataclasses.replace(hf, fn=wrapper)
