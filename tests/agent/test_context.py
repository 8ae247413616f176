"""Context policy, token estimates and compaction (pairs kept whole at every cut point)."""

from __future__ import annotations

import dataclasses

import pytest

from sunroom.agent.context import (
    SUMMARY_HEADER,
    CompactionResult,
    ContextPolicy,
    compact,
    context_window_for,
    estimate_request_tokens,
)
from sunroom.errors import UsageError
from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Message,
    Price,
    Request,
    Response,
    ScriptedModel,
    Settings,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
)

# --- policy ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"warn_at": 0},
        {"warn_at": 0.9, "compact_at": 0.8},
        {"compact_at": 1.5},
        {"context_window": 0},
        {"context_window": -5},
        {"context_window": 1000.0},
        {"context_window": True},
        {"keep_head_messages": -1},
        {"keep_tail_messages": -1},
    ],
)
def test_policy_is_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(UsageError, match="ContextPolicy"):
        ContextPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_is_frozen_and_keyword_only() -> None:
    policy = ContextPolicy()
    assert (policy.warn_at, policy.compact_at, policy.context_window, policy.enabled) == (
        0.7,
        0.85,
        None,
        True,
    )
    assert (policy.keep_head_messages, policy.keep_tail_messages) == (2, 6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.warn_at = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        ContextPolicy(0.5)  # type: ignore[call-arg]  # keyword-only: positional must fail


def test_known_windows_and_unknown_models() -> None:
    assert context_window_for("claude-haiku-4-5") == 200_000
    assert context_window_for("anthropic:claude-haiku-4-5-20251001") == 200_000
    assert context_window_for("gpt-4o-2024-08-06") == 128_000
    assert context_window_for("gemini:models/gemini-2.5-flash") == 1_048_576
    assert context_window_for("openai-compatible:llama3.2:3b") is None
    assert context_window_for("gpt-5-pro") is None  # no fuzzy matching
    assert context_window_for("scripted") is None


def test_estimate_counts_messages_tools_and_system() -> None:
    user = Request([UserMessage("x" * 400)])
    with_system = Request([SystemMessage("y" * 400), UserMessage("x" * 400)])
    tool = ToolSpec("execute_code", "Run Python", {"type": "object", "properties": {}})
    with_tools = Request([UserMessage("x" * 400)], tools=[tool])
    assert estimate_request_tokens(user) >= 100
    assert estimate_request_tokens(with_system) >= estimate_request_tokens(user) + 100
    assert estimate_request_tokens(with_tools) > estimate_request_tokens(user)


def test_assess_levels_and_inactive_policies() -> None:
    request = Request([UserMessage("x" * 4_000)])  # about 1,000 tokens
    tokens = estimate_request_tokens(request)
    assert ContextPolicy().assess(request, model_name="unknown-model").level == "inactive"
    assert ContextPolicy().window_for("unknown-model") is None
    disabled = ContextPolicy(enabled=False, context_window=10)
    assert disabled.assess(request, model_name="gpt-4o").level == "inactive"
    assert ContextPolicy().assess(request, model_name="gpt-4o").level == "ok"
    warn = ContextPolicy(context_window=int(tokens / 0.75)).assess(request, model_name="x")
    assert warn.level == "warn" and warn.tokens == tokens and warn.fraction is not None
    full = ContextPolicy(context_window=tokens).assess(request, model_name="gpt-4o")
    assert full.level == "compact" and full.window == tokens


# --- compaction -----------------------------------------------------------------------------


def call(i: int, code: str) -> ToolCall:
    return ToolCall(f"c{i}", "execute_code", {"code": code})


def transcript() -> list[Message]:
    """System, task, then turns with single, parallel and code-block (no tool) actions."""
    messages: list[Message] = [
        SystemMessage("You are an agent."),
        UserMessage("Count the records labelled 'spam' in `context`."),
    ]
    for i in range(6):
        if i == 2:  # two calls answered by two results
            messages.append(
                AssistantMessage(["Two at once.", call(20, "a = 1"), call(21, "b = 2")])
            )
            messages.append(ToolResultMessage("c20", "ok"))
            messages.append(ToolResultMessage("c21", "NameError: x", is_error=True))
        elif i == 4:  # a fenced block, no tool call, then a user turn
            messages.append(AssistantMessage("```python\nprint(len(context))\n```"))
            messages.append(UserMessage("Output:\n1000"))
        else:
            messages.append(AssistantMessage([call(i, f"step_{i} = {i}")]))
            messages.append(ToolResultMessage(f"c{i}", f"step {i} done"))
    messages.append(AssistantMessage("Almost there."))
    return messages


def assert_pairs_whole(original: list[Message], result: CompactionResult) -> None:
    kept_ids: set[str] = set()
    answered: set[str] = set()
    for message in result.messages:
        if isinstance(message, AssistantMessage):
            kept_ids.update(c.id for c in message.tool_calls)
        elif isinstance(message, ToolResultMessage):
            assert message.tool_call_id in kept_ids, "a result lost its call"
            answered.add(message.tool_call_id)
    all_results = {m.tool_call_id for m in original if isinstance(m, ToolResultMessage)}
    assert kept_ids & all_results == answered, "a call lost its result"


def summariser(summary: str = "SUMMARY") -> FunctionModel:
    return FunctionModel(lambda request: summary)


async def test_pairs_stay_together_at_every_cut_point() -> None:
    original = transcript()
    n = len(original)
    compacted = 0
    for head in range(n + 1):
        for tail in range(n + 1):
            model = summariser()
            policy = ContextPolicy(keep_head_messages=head, keep_tail_messages=tail)
            result = await compact(original, model, policy=policy)
            assert_pairs_whole(original, result)
            if result.removed == 0:
                assert result.messages == tuple(original) and not model.requests
                continue
            compacted += 1
            assert len(model.requests) == 1
            assert len(result.messages) == n - result.removed + 1
            summary_at = [
                i for i, m in enumerate(result.messages) if SUMMARY_HEADER in getattr(m, "text", "")
            ]
            assert len(summary_at) == 1
            at = summary_at[0]
            # Head and tail are the original messages, verbatim and in order.
            assert result.messages[:at] == tuple(original[:at])
            assert at >= max(head, 1)  # the head only grows; the system message is kept
            assert result.messages[at + 1 :] == tuple(
                original[n - (len(result.messages) - at - 1) :]
            )
            assert len(result.messages) - at - 1 >= min(tail, n)
            assert isinstance(result.messages[0], SystemMessage)
    assert compacted > 50


async def test_summary_call_is_one_fresh_request_and_the_summary_is_marked() -> None:
    original = transcript()
    model = ScriptedModel(
        ["- step_1 = 1 defined\n- open: count spam"], price=Price(input=1, output=2)
    )
    policy = ContextPolicy(keep_head_messages=2, keep_tail_messages=3)
    result = await compact(original, model, policy=policy, settings=Settings(timeout=30))
    assert len(model.requests) == 1
    request = model.requests[0]
    assert not request.tools and request.settings.timeout == 30
    assert isinstance(request.messages[0], SystemMessage)
    assert "variable" in request.messages[0].text and "open questions" in request.messages[0].text
    prompt = request.messages[-1]
    assert isinstance(prompt, UserMessage)
    assert "Count the records labelled 'spam'" in prompt.text  # the task, for context
    assert "step_1 = 1" in prompt.text and "NameError: x" in prompt.text
    assert "Almost there." not in prompt.text  # the tail is not summarised
    # Head (system + task), one summary message, then the tail verbatim.
    assert result.messages[:2] == tuple(original[:2])
    note = result.messages[2]
    assert isinstance(note, UserMessage)
    assert note.text.startswith(SUMMARY_HEADER)
    assert "step_1 = 1 defined" in note.text
    assert f"{result.removed} earlier messages" in note.text
    assert result.messages[3:] == tuple(original[len(original) - len(result.messages) + 3 :])
    assert result.summary == "- step_1 = 1 defined\n- open: count spam"
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    assert result.cost_micro_usd is not None


async def test_tail_boundary_moves_back_to_keep_a_call_with_its_results() -> None:
    original = transcript()
    # A tail that would start on the second result of a two-call message.
    index = next(
        i
        for i, m in enumerate(original)
        if isinstance(m, ToolResultMessage) and m.tool_call_id == "c21"
    )
    tail = len(original) - index
    result = await compact(original, summariser(), policy=ContextPolicy(keep_tail_messages=tail))
    assert_pairs_whole(original, result)
    # The tail grew back to the assistant message holding both calls.
    call_message = original[index - 2]
    assert isinstance(call_message, AssistantMessage) and len(call_message.tool_calls) == 2
    assert call_message in result.messages
    assert result.messages[-(tail + 2) :] == tuple(original[index - 2 :])


async def test_disabled_policy_does_nothing() -> None:
    original = transcript()
    model = ScriptedModel([])  # any call would raise ScriptExhaustedError
    result = await compact(original, model, policy=ContextPolicy(enabled=False))
    assert result.messages == tuple(original) and result.removed == 0
    assert result.usage == Usage() and not model.requests


async def test_short_transcript_needs_no_call() -> None:
    original: list[Message] = [SystemMessage("s"), UserMessage("task"), AssistantMessage("ok")]
    model = ScriptedModel([])
    result = await compact(original, model, policy=ContextPolicy())
    assert result.removed == 0 and result.messages == tuple(original) and not model.requests


async def test_a_truncated_summary_is_kept_and_marked() -> None:
    response = Response(
        message=AssistantMessage("partial summ"), finish_reason="length", usage=Usage(10, 5)
    )
    result = await compact(
        transcript(), ScriptedModel([response]), policy=ContextPolicy(keep_tail_messages=1)
    )
    note = result.messages[2]
    assert isinstance(note, UserMessage)
    assert "partial summ\n[summary cut off at the output limit]" in note.text
    assert result.usage == Usage(10, 5)


async def test_huge_messages_are_clipped_for_the_summariser() -> None:
    original: list[Message] = [
        SystemMessage("s"),
        UserMessage("task"),
        AssistantMessage([call(1, "print(data)")]),
        ToolResultMessage("c1", "HEAD" + "x" * 1_000_000 + "TAIL"),
        AssistantMessage("done"),
    ]
    model = summariser()
    result = await compact(original, model, policy=ContextPolicy(keep_tail_messages=1))
    assert result.removed == 2
    prompt = model.requests[0].messages[-1].text  # type: ignore[union-attr]
    assert len(prompt) < 30_000
    assert "HEAD" in prompt and "TAIL" in prompt and "characters omitted" in prompt


async def test_a_provider_error_leaves_the_transcript_alone() -> None:
    from sunroom.errors import OverloadedError

    original = transcript()
    with pytest.raises(OverloadedError):
        await compact(original, ScriptedModel([OverloadedError("busy")]), policy=ContextPolicy())
    assert original == transcript()
