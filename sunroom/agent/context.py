"""Context management: how full a request is, and compaction of a long transcript.

A :class:`ContextPolicy` says when a session warns (``warn_at``, a fraction of the model's
context window) and when it compacts (``compact_at``). The window comes from the policy
(``context_window=``) or from :func:`context_window_for`'s table of known models; when neither
knows it, the policy is inactive. :func:`estimate_request_tokens` is the local estimate the
watermarks are compared with.

:func:`compact` replaces the middle of a transcript with a summary written by one model call,
keeping the head (system prompt and task) and the tail verbatim. It never separates an
assistant's tool call from its results: the cut points move so that each pair stays whole.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias, final

from sunroom.agent.calls import complete_traced
from sunroom.errors import UsageError
from sunroom.providers import (
    AssistantMessage,
    Message,
    Model,
    Request,
    Settings,
    SystemMessage,
    TextPart,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    estimate_tokens,
)

__all__ = [
    "SUMMARY_HEADER",
    "CompactionResult",
    "ContextLevel",
    "ContextPolicy",
    "ContextStatus",
    "compact",
    "context_window_for",
    "estimate_request_tokens",
]

ContextLevel: TypeAlias = Literal["inactive", "ok", "warn", "compact"]
"""Where a request stands: no known window or policy disabled (``inactive``), below the warning
watermark (``ok``), past it (``warn``), past the compaction watermark (``compact``)."""

# The most prompt tokens each model accepts. Sources: Anthropic's models overview and context
# windows pages (platform.claude.com/docs/en/about-claude/models/overview, .../build-with-claude/
# context-windows: 1M for Opus 4.6-4.8 and Sonnet 4.6, 200k for the others; Sonnet 4.5's 1M beta
# retired 2026-04-30); OpenAI's model pages (developers.openai.com/api/docs/models: GPT-5 to 5.2
# have a 400k window of which 128k is reserved for output, so 272k of prompt; GPT-4.1 1,047,576;
# GPT-4o 128k; o3 and o4-mini 200k); Gemini's model pages (ai.google.dev/gemini-api/docs/models:
# an input limit of 1,048,576). Transcribed 2026-11-30, partly through third-party summaries of
# those pages. Models whose window we could not confirm (GPT-5.4/5.5 and their minis) are left
# out: give ContextPolicy(context_window=...) for them, and for local models.
_WINDOWS: dict[str, int] = {
    "claude-opus-4-8": 1_000_000,
    "claude-opus-4-7": 1_000_000,
    "claude-opus-4-6": 1_000_000,
    "claude-sonnet-4-6": 1_000_000,
    "claude-opus-4-5": 200_000,
    "claude-opus-4-1": 200_000,
    "claude-opus-4-0": 200_000,
    "claude-sonnet-4-5": 200_000,
    "claude-sonnet-4-0": 200_000,
    "claude-3-7-sonnet": 200_000,
    "claude-haiku-4-5": 200_000,
    "claude-3-5-haiku": 200_000,
    "gpt-5.2": 272_000,
    "gpt-5.1": 272_000,
    "gpt-5": 272_000,
    "gpt-5-mini": 272_000,
    "gpt-5-nano": 272_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "gemini-3.1-pro-preview": 1_048_576,
    "gemini-3-flash-preview": 1_048_576,
    "gemini-2.5-pro": 1_048_576,
    "gemini-2.5-flash": 1_048_576,
    "gemini-2.5-flash-lite": 1_048_576,
    "gemini-2.0-flash": 1_048_576,
}

_DATE_SUFFIX = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


def context_window_for(model_name: str) -> int | None:
    """The prompt-token limit of a known model, or ``None`` when it is not in the table.

    Accepts a bare name (``"claude-haiku-4-5"``) or a spec (``"anthropic:claude-haiku-4-5"``);
    a trailing date (``-20251001``) and Gemini's ``models/`` prefix are ignored. Nothing
    fuzzier: an unknown name is ``None``, never a guess.
    """
    name = model_name.partition(":")[2] if ":" in model_name else model_name
    name = name.strip().lower().removeprefix("models/")
    return _WINDOWS.get(name) or _WINDOWS.get(_DATE_SUFFIX.sub("", name))


def estimate_request_tokens(request: Request) -> int:
    """The local estimate of a request's prompt tokens.

    Messages (system included), tools and output schema, as
    :func:`sunroom.providers.estimate_tokens` counts them.
    """
    return estimate_tokens(request)


@final
@dataclass(frozen=True, slots=True)
class ContextStatus:
    """How full one request is: estimated ``tokens`` against ``window``, and its ``level``."""

    tokens: int
    window: int | None
    level: ContextLevel

    @property
    def fraction(self) -> float | None:
        """``tokens / window``, or ``None`` without a window."""
        return None if self.window is None else self.tokens / self.window


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class ContextPolicy:
    """When to warn about and when to compact a long transcript.

    Attributes:
        warn_at: Fraction of the context window at which a session warns (once).
        compact_at: Fraction at which it compacts the transcript before the next model call.
        context_window: Prompt tokens the model accepts; ``None`` looks the model up with
            :func:`context_window_for`, and a model not found there leaves the policy inactive.
        enabled: ``False`` turns warnings and compaction off.
        keep_head_messages: Messages kept verbatim at the start (default: system prompt and
            task); leading system messages are always kept.
        keep_tail_messages: Most recent messages kept verbatim (at least; a cut never separates
            a tool call from its results).

    Raises:
        UsageError: ``0 < warn_at <= compact_at <= 1`` does not hold, ``context_window`` is
            not a positive int, or a ``keep_*`` count is negative.
    """

    warn_at: float = 0.7
    compact_at: float = 0.85
    context_window: int | None = None
    enabled: bool = True
    keep_head_messages: int = 2
    keep_tail_messages: int = 6

    def __post_init__(self) -> None:
        if not 0 < self.warn_at <= self.compact_at <= 1:
            raise UsageError(
                f"ContextPolicy needs 0 < warn_at <= compact_at <= 1, got warn_at={self.warn_at} "
                f"and compact_at={self.compact_at}"
            )
        window = self.context_window
        if window is not None and (not isinstance(window, int) or isinstance(window, bool)):
            raise UsageError(f"ContextPolicy.context_window must be an int, got {window!r}")
        if window is not None and window <= 0:
            raise UsageError(f"ContextPolicy.context_window must be positive, got {window}")
        for name in ("keep_head_messages", "keep_tail_messages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UsageError(f"ContextPolicy.{name} must be an int >= 0, got {value!r}")

    def window_for(self, model_name: str) -> int | None:
        """The window this policy applies to ``model_name``.

        ``context_window`` when set, else :func:`context_window_for`; ``None`` (inactive) when
        the policy is disabled or the model unknown.
        """
        if not self.enabled:
            return None
        if self.context_window is not None:
            return self.context_window
        return context_window_for(model_name)

    def assess(self, request: Request, *, model_name: str) -> ContextStatus:
        """Estimate ``request`` and say whether it is ``ok``, past ``warn`` or ``compact``."""
        window = self.window_for(model_name)
        if window is None:
            return ContextStatus(0, None, "inactive")
        tokens = estimate_request_tokens(request)
        level: ContextLevel = "ok"
        if tokens >= self.compact_at * window:
            level = "compact"
        elif tokens >= self.warn_at * window:
            level = "warn"
        return ContextStatus(tokens, window, level)


@final
@dataclass(frozen=True, slots=True)
class CompactionResult:
    """The transcript after :func:`compact`.

    Attributes:
        messages: Head, one summary message, tail (the input itself when nothing was done).
        usage: The summary call's usage (zero when no call was made).
        removed: How many messages the summary replaced (0: nothing was compacted).
        cost_micro_usd: The summary call's cost, ``None`` when unknown or no call was made.
        summary: The summary text ("" when nothing was compacted).
    """

    messages: tuple[Message, ...]
    usage: Usage
    removed: int
    cost_micro_usd: int | None = None
    summary: str = ""


SUMMARY_HEADER = "[Summary of earlier conversation]"
"""The first line of the user message that replaces the compacted middle of a transcript."""

_SUMMARY_INSTRUCTIONS = """\
You compress part of an agent's working transcript so that it can continue its task with less \
context. The agent acts by writing Python that runs in a persistent kernel. Write a faithful \
summary of the transcript excerpt you are given.

Keep, precisely:
- every fact and result established (numbers, names, values, file paths, outputs that matter);
- every variable, function and object defined in the kernel, with its name, type and meaning \
(they still exist in the kernel);
- decisions taken and why; approaches tried that failed, and the errors they raised;
- open questions and the next steps the agent intended.

Do not invent anything, do not solve the task, do not address the user, and do not add advice. \
Write terse plain text in the order things happened."""

_MAX_CHARS_PER_MESSAGE = 20_000  # longer messages are shown to the summariser head and tail


def _clip(text: str) -> str:
    if len(text) <= _MAX_CHARS_PER_MESSAGE:
        return text
    half = _MAX_CHARS_PER_MESSAGE // 2
    omitted = len(text) - 2 * half
    return f"{text[:half]}\n[... {omitted} characters omitted ...]\n{text[-half:]}"


def _render_call(call: ToolCall) -> str:
    code = call.arguments.get("code") if call.raw_arguments is None else None
    if isinstance(code, str) and len(call.arguments) == 1:
        return f"[assistant calls {call.name} (id {call.id})]\n```python\n{code}\n```"
    args = call.raw_arguments or json.dumps(dict(call.arguments), ensure_ascii=False)
    return f"[assistant calls {call.name} (id {call.id})] {args}"


def _render(message: Message) -> str:
    if isinstance(message, SystemMessage):
        return f"[system]\n{_clip(message.text)}"
    if isinstance(message, UserMessage):
        parts = [p.text if isinstance(p, TextPart) else "[image]" for p in message.content]
        return f"[user]\n{_clip(''.join(parts))}"
    if isinstance(message, ToolResultMessage):
        kind = "error" if message.is_error else "result"
        return f"[tool {kind} for id {message.tool_call_id}]\n{_clip(message.content)}"
    lines = []
    for part in message.content:
        if isinstance(part, TextPart) and part.text:
            lines.append(f"[assistant]\n{_clip(part.text)}")
        elif isinstance(part, ToolCall):
            lines.append(_clip(_render_call(part)))
    return "\n".join(lines) or "[assistant] (empty)"


def _valid_cuts(messages: Sequence[Message]) -> list[bool]:
    """``valid[i]``: cutting before ``messages[i]`` keeps every tool call with its results."""
    valid = [True] * (len(messages) + 1)
    called_at: dict[str, int] = {}
    for i, message in enumerate(messages):
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                called_at[call.id] = i
        elif isinstance(message, ToolResultMessage):
            # A result without a known call stays with the message before it.
            for cut in range(called_at.get(message.tool_call_id, i - 1) + 1, i + 1):
                valid[cut] = False
    return valid


def _bounds(messages: Sequence[Message], policy: ContextPolicy) -> tuple[int, int]:
    """``(head_end, tail_start)``: the middle is ``messages[head_end:tail_start]``."""
    valid = _valid_cuts(messages)
    leading_system = 0
    while leading_system < len(messages) and isinstance(messages[leading_system], SystemMessage):
        leading_system += 1
    head_end = min(max(policy.keep_head_messages, leading_system), len(messages))
    while not valid[head_end]:  # grow the head over the rest of a call/result group
        head_end += 1
    tail_start = max(len(messages) - policy.keep_tail_messages, 0)
    while not valid[tail_start]:  # grow the tail back to the start of its group
        tail_start -= 1
    return head_end, tail_start


async def compact(
    messages: Sequence[Message],
    model: Model,
    *,
    policy: ContextPolicy,
    settings: Settings | None = None,
) -> CompactionResult:
    """Summarise the middle of ``messages`` with one call to ``model``.

    The head (``policy.keep_head_messages``, and every leading system message) and the tail
    (``policy.keep_tail_messages``) stay verbatim; both boundaries move outwards as needed so
    that no assistant tool call is separated from its results. The middle becomes one
    :class:`~sunroom.providers.UserMessage` starting with :data:`SUMMARY_HEADER`. When the policy
    is disabled or there is no middle, no call is made and the messages come back unchanged.
    A summary cut off at the output limit is kept, marked as cut off.

    ``settings`` apply to the summary call (e.g. a timeout or an output cap).

    Raises:
        ProviderError: the summary call failed (the transcript is left as it was).
    """
    original = tuple(messages)
    if not policy.enabled:
        return CompactionResult(original, Usage(), 0)
    head_end, tail_start = _bounds(original, policy)
    if head_end >= tail_start:
        return CompactionResult(original, Usage(), 0)
    head, middle, tail = original[:head_end], original[head_end:tail_start], original[tail_start:]
    task = "\n\n".join(_clip(m.text) for m in head if isinstance(m, UserMessage))
    excerpt = "\n\n".join(_render(m) for m in middle)
    prompt = (
        f"The agent's task:\n{task}\n\n" if task else ""
    ) + f"The transcript excerpt to summarise ({len(middle)} messages):\n\n{excerpt}"
    request = Request(
        [SystemMessage(_SUMMARY_INSTRUCTIONS), UserMessage(prompt)],
        settings=settings or Settings(),
    )
    response = await complete_traced(model, request)
    summary = response.text.strip() or "(the summariser returned nothing)"
    if response.finish_reason == "length":
        summary += "\n[summary cut off at the output limit]"
    note = UserMessage(
        f"{SUMMARY_HEADER}\n{len(middle)} earlier messages were replaced by this summary to save "
        f"context; the Python kernel still holds every variable they defined.\n\n{summary}\n\n"
        "[End of summary; the conversation continues below.]"
    )
    return CompactionResult(
        (*head, note, *tail),
        response.usage,
        len(middle),
        response.cost_micro_usd,
        summary,
    )
