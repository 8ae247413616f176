"""A session's guard over what models and events see: redaction and the context policy.

:class:`Guard` joins :mod:`sunroom.agent.redaction` (every text a model, an event or a log
sees is redacted) and :mod:`sunroom.agent.context` (before each root model call: a warning at
the high watermark, compaction at the higher one, counted against the session's budget).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, final

from sunroom.agent import events as ev
from sunroom.agent.calls import ModelGate, Publish
from sunroom.agent.redaction import Redactor, Secrets
from sunroom.errors import UsageError
from sunroom.providers import Message, Model, Request, ToolSpec

try:  # built alongside; until it lands, sessions run without a context policy
    from sunroom.agent.context import ContextPolicy, compact, estimate_request_tokens
except ImportError:  # pragma: no cover - transitional
    ContextPolicy = compact = estimate_request_tokens = None


@final
class Guard:
    """Redacts text and values, and keeps a transcript within the context policy."""

    def __init__(self, redactor: Redactor, policy: Any) -> None:
        self._redactor = redactor
        self.policy = policy
        self._warned = False

    def redact(self, text: str) -> str:
        """*text* with every registered secret replaced."""
        return self._redactor.redact(text)

    def redact_value(self, value: Any) -> Any:
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
        window = None if policy is None else policy.context_window
        if policy is None or not policy.enabled or window is None:
            return
        tokens = estimate_request_tokens(Request(messages, tools=tools))
        if tokens >= policy.compact_at * window:
            gate.tracker.reserve()
            try:
                done = await compact(messages, model, policy=policy)
            except BaseException:
                gate.tracker.release()
                raise
            gate.tracker.record_usage(done.usage, None, sub_call=False)
            messages[:] = list(done.messages)
            after = estimate_request_tokens(Request(messages, tools=tools))
            self._warned = False
            publish(
                ev.ContextCompacted, tokens_before=tokens, tokens_after=after, removed=done.removed
            )
        elif tokens >= policy.warn_at * window and not self._warned:
            self._warned = True
            publish(ev.ContextWarning, tokens=tokens, context_window=window)


def context_guard(secrets: Secrets | Mapping[str, str] | Iterable[str], context: Any) -> Guard:
    """A guard for *secrets* and a ``ContextPolicy`` (None: the default policy).

    Raises UsageError when *context* is not a ContextPolicy.
    """
    if ContextPolicy is not None:
        if context is None:
            context = ContextPolicy()
        if not isinstance(context, ContextPolicy):
            raise UsageError("context must be a sunroom.agent.context.ContextPolicy")
    registry = secrets if isinstance(secrets, Secrets) else Secrets(secrets)
    return Guard(Redactor(registry), context)
