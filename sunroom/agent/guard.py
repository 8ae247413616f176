"""A session's guard over what models and events see: redaction and the context policy.

:class:`Guard` joins :mod:`sunroom.agent.redaction` (every text a model, an event or a log
sees is redacted) and :mod:`sunroom.agent.context` (before each root model call: a warning at
the high watermark, compaction at the higher one, counted against the session's budget).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar, final

from sunroom.agent import events as ev
from sunroom.agent.calls import ModelGate, Publish
from sunroom.agent.context import ContextPolicy, compact, estimate_request_tokens
from sunroom.agent.redaction import Redactor, Secrets
from sunroom.errors import UsageError
from sunroom.providers import Message, Model, Request, ToolSpec

T = TypeVar("T")


@final
class Guard:
    """Redacts text and values, and keeps a transcript within the context policy."""

    def __init__(self, redactor: Redactor, policy: ContextPolicy) -> None:
        self._redactor = redactor
        self.policy = policy
        self._warned = False

    def redact(self, text: str) -> str:
        """*text* with every registered secret replaced."""
        return self._redactor.redact(text)

    def ready(self, text: str) -> int:
        """How much of streamed *text* can be redacted and shown now (:meth:`Redactor.ready`)."""
        return self._redactor.ready(text)

    def redact_value(self, value: T) -> T:
        """*value* with secrets replaced in its strings (containers and dataclasses walked)."""
        return self._redactor.redact_value(value)

    async def fit(
        self,
        messages: list[Message],
        *,
        tools: Iterable[ToolSpec],
        gate: ModelGate,
        model: Model,
        publish: Publish,
    ) -> None:
        """Warn or compact *messages* in place per the policy before the next model call.

        Compaction is one model call, reserved against the budget (BudgetExceededError when
        the budget forbids it).
        """
        policy = self.policy
        status = policy.assess(Request(messages, tools=tools), model_name=model.name)
        if status.window is None or status.level == "ok" or status.level == "inactive":
            return
        if status.level == "warn":
            if not self._warned:
                self._warned = True
                publish(ev.ContextWarning, tokens=status.tokens, context_window=status.window)
            return
        gate.tracker.reserve()
        try:
            done = await compact(messages, model, policy=policy)
        except BaseException:
            gate.tracker.release()
            raise
        if done.removed == 0:
            gate.tracker.release()
            return
        gate.tracker.record_usage(done.usage, done.cost_micro_usd, sub_call=False)
        messages[:] = list(done.messages)
        self._warned = False
        after = estimate_request_tokens(Request(messages, tools=tools))
        publish(
            ev.ContextCompacted,
            tokens_before=status.tokens,
            tokens_after=after,
            removed=done.removed,
        )


def context_guard(secrets: Secrets | Mapping[str, str] | Iterable[str], context: object) -> Guard:
    """A guard for *secrets* and a ``ContextPolicy`` (None: the default policy).

    Raises UsageError when *context* is not a ContextPolicy.
    """
    if context is None:
        context = ContextPolicy()
    if not isinstance(context, ContextPolicy):
        raise UsageError("context must be a sunroom.agent.context.ContextPolicy")
    registry = secrets if isinstance(secrets, Secrets) else Secrets(secrets)
    return Guard(Redactor(registry), context)
