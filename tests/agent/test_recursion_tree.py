"""The recursion tree in the log: a ``SubCallEnded`` per sub-call, nested sessions included,
and host calls with previews of their arguments and results (redacted, bounded)."""

from __future__ import annotations

from sunroom.agent import AsyncSession
from sunroom.agent import events as ev
from sunroom.agent.previews import json_preview
from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Price,
    Request,
    ScriptedModel,
    UserMessage,
)
from tests.agent.conftest import code, collect

FAST = "subprocess"
PRICE = Price(input=1, output=2)


def _last_text(request: Request) -> str:
    """The text of the request's last message (a sub-call's input)."""
    message = request.messages[-1]
    assert isinstance(message, UserMessage)
    return message.text


async def test_predict_many_over_5_items_is_5_children_of_its_host_call() -> None:
    cell = "print(predict_many('shout', ['a', 'b', 'c', 'd', 'e']))"
    root = ScriptedModel([code(cell), "done"])
    sub = FunctionModel(lambda r: _last_text(r).upper(), name="leaf", price=PRICE)
    async with AsyncSession(model=root, sub_model=sub, backend=FAST) as s:
        events = s.events()
        result = await s.run("go")
        seen = await collect(events)
    assert result.ok
    started = next(e for e in seen if isinstance(e, ev.HostCallStarted))
    finished = next(e for e in seen if isinstance(e, ev.HostCallFinished))
    assert started.name == "predict_many"
    assert started.arguments == (
        '{"instructions": "shout", "inputs": ["a", "b", "c", "d", "e"], "output": null, '
        '"recursive": false}'
    )
    assert finished.result == '["A", "B", "C", "D", "E"]'
    nodes = sorted((e for e in seen if isinstance(e, ev.SubCallEnded)), key=lambda e: e.index)
    assert [n.node for n in nodes] == [f"{started.call_id}.{i}" for i in range(5)]
    assert {(n.parent, n.depth, n.name, n.model, n.recursive) for n in nodes} == {
        (None, 1, "predict_many", "leaf", False)
    }
    assert [(n.input, n.output, n.error) for n in nodes] == [
        (x, f'"{x.upper()}"', None) for x in "abcde"
    ]
    assert all(n.input_tokens > 0 and n.output_tokens > 0 for n in nodes)
    own = [n.cost_micro_usd for n in nodes]
    assert all(isinstance(c, int) and c > 0 for c in own)
    assert finished.cost_micro_usd == sum(c for c in own if c is not None)  # the rollup
    assert all(n.duration_s > 0 and n.ts >= started.ts for n in nodes)


async def test_a_failed_item_is_a_node_with_its_error_and_no_output() -> None:
    def leaf(request: Request) -> str:
        if _last_text(request) == "bad":
            raise ValueError("no good")
        return "fine"

    root = ScriptedModel([code("predict_many('x', ['ok', 'bad'])"), "done"])
    async with AsyncSession(model=root, sub_model=FunctionModel(leaf), backend=FAST) as s:
        events = s.events()
        await s.run("go")
        seen = await collect(events)
    nodes = {e.index: e for e in seen if isinstance(e, ev.SubCallEnded)}
    assert nodes[0].error is None and nodes[0].output == '"fine"'
    assert nodes[1].output == "" and nodes[1].error is not None
    assert "ValueError" in nodes[1].error and "no good" in nodes[1].error


async def test_nested_sessions_report_their_sub_calls_under_their_node_three_levels_deep() -> None:
    """root -> predict(recursive) -> nested session -> predict_many over 2 leaves."""

    def model(request: Request) -> str | AssistantMessage:
        if not request.tools:  # a leaf sub-call
            return "leaf:" + _last_text(request)
        turns = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if turns == 0:  # the nested session's first turn
            return code("submit(' '.join(predict_many('leaf', ['p', 'q'])))")
        return "done"

    sub = FunctionModel(model, name="sub", price=PRICE)
    root = ScriptedModel(  # free: every micro-USD of the run is then in the tree
        [code("print(predict('go deeper', 'topic', recursive=True))"), "finished"],
        price=Price(input=0, output=0),
    )
    async with AsyncSession(model=root, sub_model=sub, backend=FAST, max_depth=2) as s:
        events = s.events()
        result = await s.run("go")
        seen = await collect(events)
    assert result.ok
    nodes = [e for e in seen if isinstance(e, ev.SubCallEnded)]
    top = [n for n in nodes if n.parent is None]
    assert len(top) == 1 and top[0].recursive and top[0].depth == 1 and top[0].error is None
    assert top[0].output == '"leaf:p leaf:q"'
    children = [n for n in nodes if n.parent == top[0].node]
    assert sorted(n.index for n in children) == [0, 1]
    assert {(n.depth, n.name, n.recursive) for n in children} == {(2, "predict_many", False)}
    assert len({n.call_id for n in children}) == 1 and children[0].call_id != top[0].call_id
    # the nested node's own spend is its session's root-model turn, not its children's
    assert top[0].input_tokens > 0 and top[0].cost_micro_usd is not None
    assert all(n.cost_micro_usd for n in nodes)
    assert result.cost_micro_usd == sum(n.cost_micro_usd or 0 for n in nodes)
    assert max(n.ts for n in children) <= top[0].ts  # children end before their parent


async def test_previews_are_redacted_before_they_are_cut_and_bounded() -> None:
    secret = "s3cr3t-value-0123456789"
    long_arg = "x" * (ev.PREVIEW_CHARS - 5) + secret  # the secret straddles the cut

    def echo(text: str) -> str:
        """Returns its argument."""
        return text

    cell = f"echo({long_arg!r}); echo('short')"
    root = ScriptedModel([code(cell), "done"])
    async with AsyncSession(model=root, backend=FAST, functions=[echo], secrets={"K": secret}) as s:
        events = s.events()
        await s.run("go")
        seen = await collect(events)
    starts = [e for e in seen if isinstance(e, ev.HostCallStarted)]
    ends = [e for e in seen if isinstance(e, ev.HostCallFinished)]
    assert len(starts) == 2 and len(ends) == 2
    for text in (starts[0].arguments, ends[0].result):
        assert text is not None and len(text) == ev.PREVIEW_CHARS and text.endswith("…")
        assert "s3cr" not in text and secret[:8] not in text
    assert starts[1].arguments == '{"text": "short"}' and ends[1].result == '"short"'


def test_json_preview_stops_early_and_never_calls_repr() -> None:
    class Loud:
        def __repr__(self) -> str:
            raise AssertionError("repr must not be called")

    huge = list(range(10_000_000))
    text = json_preview({"rows": huge, "obj": Loud(), "raw": b"\x00" * 9}, limit=100)
    assert text.startswith('{"rows": [0, 1, 2') and 100 < len(text) < 120
    assert json_preview({"o": Loud(), "b": b"ab", "n": None}) == (
        '{"o": "<Loud>", "b": "<2 bytes>", "n": null}'
    )
