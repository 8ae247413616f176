"""``AsyncSession(network=...)``: events per connection, the byte budget, the prompt line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sunroom import AsyncSession, Network
from sunroom.agent import events as ev
from sunroom.agent.budget import Budget
from sunroom.providers import Request, SystemMessage
from sunroom.providers.fakes import ScriptedModel
from tests.agent.conftest import code, collect, last_output
from tests.network.origin import serving

pytestmark = [pytest.mark.asyncio, pytest.mark.usefixtures("no_process_left")]


@pytest.fixture
def port() -> Iterator[int]:
    with serving(lambda path, _: b"y" * int(path.rsplit("/", 1)[1])) as port:
        yield port


def policy(port: int) -> Network:
    return Network(
        allow=(f"data.test:{port}",),
        hosts={"data.test": "127.0.0.1"},
        allow_addresses=("127.0.0.1",),
    )


def system_text(request: Request) -> str:
    first = request.messages[0]
    assert isinstance(first, SystemMessage)
    return first.text


GET = (
    "import urllib.request\n"
    "def get(url):\n"
    "    try:\n"
    "        return len(urllib.request.urlopen(url, timeout=20).read())\n"
    "    except Exception as e:\n"
    "        return type(e).__name__\n"
)


async def test_connections_are_events_and_the_prompt_names_the_hosts(port: int) -> None:
    model = ScriptedModel(
        [
            code(
                GET + f"print(get('http://data.test:{port}/1000'), get('http://x.test:{port}/1'))"
            ),
            code("submit('done')"),
        ]
    )
    async with AsyncSession(model=model, preset="rlm", network=policy(port)) as s:
        sub = s.events()
        result = await s.run("fetch it")
        events = await collect(sub)
        spent = s.tracker.snapshot()
    assert result.status == "success", result
    assert last_output(model.requests[1]).strip() == "1000 HTTPError"
    assert f"data.test:{port}" in system_text(model.requests[0])
    conns = [e for e in events if isinstance(e, ev.NetworkConnection)]
    # a connection is recorded when it ends, on the egress thread: two in a row may be
    # recorded in either order
    assert sorted((c.host, c.allowed) for c in conns) == [("data.test", True), ("x.test", False)]
    allowed, refused = (next(c for c in conns if c.host == h) for h in ("data.test", "x.test"))
    assert allowed.bytes_received > 1000 and allowed.scheme == "http"
    assert refused.reason is not None and refused.bytes_received == 0
    assert spent.network_bytes == allowed.bytes_sent + allowed.bytes_received


async def test_the_network_budget_cuts_the_transfer_and_ends_the_run(port: int) -> None:
    model = ScriptedModel(
        [
            code(GET + f"print(get('http://data.test:{port}/3000000'))"),
            code("submit('never')"),
        ]
    )
    budget = Budget(max_network_bytes=1_000_000)
    async with AsyncSession(model=model, network=policy(port), budget=budget) as s:
        sub = s.events()
        result = await s.run("fetch it")
        events = await collect(sub)
    assert result.status == "budget_exceeded", result
    warnings = [e for e in events if isinstance(e, ev.BudgetWarning)]
    assert [w.limit for w in warnings] == ["network_bytes"]
    assert "1,000,000 bytes" in warnings[0].message
    assert len(model.requests) == 1  # no model call after the budget was spent
    (finished,) = [e for e in events if isinstance(e, ev.ExecutionFinished)]
    assert "IncompleteRead" in finished.output


async def test_a_nested_session_gets_the_same_policy(port: int) -> None:
    sub = ScriptedModel([code(GET + f"submit(get('http://data.test:{port}/10'))")])
    root = ScriptedModel([code("print(predict('fetch', 'x', output=int, recursive=True))"), "ok"])
    async with AsyncSession(
        model=root, sub_model=sub, max_depth=2, backend="bwrap", network=policy(port)
    ) as s:
        result = await s.run("go")
    assert result.ok, result
    assert last_output(root.requests[1]).strip() == "10"  # the nested kernel reached the host
