"""``AsyncSession(embeddings=...)`` / ``Session(embeddings=...)``: embed and search in a session."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest

from sunroom import AsyncSession, Session
from sunroom.agent import events as ev
from sunroom.agent.budget import Budget
from sunroom.embeddings import OnnxEmbedder
from sunroom.embeddings.functions import Embedder
from sunroom.errors import UsageError
from sunroom.providers import Request, SystemMessage
from sunroom.providers.fakes import ScriptedModel
from tests.agent.conftest import code, collect, last_output
from tests.conftest import _require
from tests.embeddings.fake_embedder import HashingEmbedder


def system_text(request: Request) -> str:
    first = request.messages[0]
    assert isinstance(first, SystemMessage)
    return first.text


ROOT = Path(__file__).resolve().parents[2]

CHUNKS = ["the invoice total is 42 dollars", "weather was sunny", "the cat sleeps"]


@pytest.fixture(params=["subprocess", "bwrap"])
def kernel_backend(request: pytest.FixtureRequest) -> str:
    return _require(request.param)


async def test_session_binds_embed_and_search_and_events_record_them(kernel_backend: str) -> None:
    emb = HashingEmbedder(dim=128)
    model = ScriptedModel(
        [
            code(
                f"chunks = {CHUNKS!r}\n"
                "hits = search('invoice total dollars', chunks, k=1)\n"
                "print(hits[0].index, len(embed(chunks)[0]))"
            ),
            code("submit(hits[0].text)"),
        ]
    )
    async with AsyncSession(model=model, preset="rlm", backend=kernel_backend, embeddings=emb) as s:
        sub = s.events()
        result = await s.run("find the invoice")
        events = await collect(sub)
        spent = s.tracker.snapshot()
    assert result.status == "success", result
    assert result.output == CHUNKS[0]
    assert last_output(model.requests[1]).strip() == "0 128"
    names = [e.name for e in events if isinstance(e, ev.HostCallFinished)]
    assert names[:2] == ["search", "embed"]
    assert spent.embedding_calls == 2 and spent.model_calls == 2
    prompt = system_text(model.requests[0])
    assert "def search(query: str, texts: list[str], k: int=10) -> list[Hit]:" in prompt
    assert "-> list[list[float]]:" in prompt
    assert "rank them with search(query, chunks, k)" in prompt


async def test_the_search_advice_is_only_in_the_rlm_prompt_with_embeddings() -> None:
    plain = ScriptedModel(["done"])
    async with AsyncSession(model=plain, preset="rlm", backend="subprocess") as s:
        await s.run("x")
    codeact = ScriptedModel(["done"])
    async with AsyncSession(model=codeact, backend="subprocess", embeddings=HashingEmbedder()) as s:
        await s.run("x")
    for model in (plain, codeact):
        assert "rank them with search" not in (system_text(model.requests[0]))
    assert "def search(" in system_text(codeact.requests[0])
    assert "def search(" not in system_text(plain.requests[0])


async def test_max_embedding_calls_ends_the_run_budget_exceeded() -> None:
    emb = HashingEmbedder(dim=8)
    model = ScriptedModel(
        [code("embed(['a'])\nsearch('a', ['a', 'b'])\nprint('third:', embed(['c']))"), "never"]
    )
    async with AsyncSession(
        model=model,
        backend="subprocess",
        embeddings=emb,
        budget=Budget(max_embedding_calls=2),
    ) as s:
        sub = s.events()
        result = await s.run("embed thrice")
        events = await collect(sub)
    assert result.status == "budget_exceeded", result
    warnings = [e for e in events if isinstance(e, ev.BudgetWarning)]
    assert [w.limit for w in warnings] == ["embedding_calls"]
    assert "budget of 2 embedding calls is spent" in warnings[0].message
    assert len(emb.calls) == 3  # embed, then search's documents and query: the third refused


def test_budget_refuses_a_non_positive_embedding_limit() -> None:
    with pytest.raises(UsageError, match="max_embedding_calls must be positive"):
        Budget(max_embedding_calls=0)


async def test_a_function_named_search_clashes_with_embeddings() -> None:
    def search(query: str) -> str:
        return query

    with pytest.raises(UsageError, match="two host functions are named 'search'"):
        AsyncSession(model=ScriptedModel([]), functions=[search], embeddings=HashingEmbedder())


async def test_sessions_share_one_embedder_and_one_cache() -> None:
    emb = HashingEmbedder(dim=256)

    async def one(i: int) -> object:
        model = ScriptedModel(
            [code(f"submit(search('the cat sleeps', {CHUNKS!r}, k=1)[0].index + {i})")]
        )
        async with AsyncSession(
            model=model, preset="rlm", backend="subprocess", embeddings=emb
        ) as s:
            result = await s.run("go")
        return result.output

    outputs = await asyncio.gather(*(one(i) for i in range(4)))
    assert outputs == [2, 3, 4, 5]
    documents = [t for kind, t in emb.calls if kind == "document"]
    assert sum(len(t) for t in documents) <= 3 * 4  # at most each session once; cached after


def test_the_sync_twin_takes_embeddings() -> None:
    emb = HashingEmbedder(dim=8)
    model = ScriptedModel([code("submit(len(embed(['a', 'b'])))")])
    with Session(model=model, preset="rlm", backend="subprocess", embeddings=emb) as s:
        result = s.run("count")
    assert result.output == 2


# --- the real model ----------------------------------------------------------------------------


async def test_a_session_searches_with_the_real_model(
    kernel_backend: str, embedder: OnnxEmbedder
) -> None:
    shared: Embedder = embedder  # OnnxEmbedder is what sessions take (checked by mypy)
    docs = ["It's so sunny outside!", "He drove to the stadium.", "Stocks fell on Monday."]
    model = ScriptedModel(
        [code(f"submit([h.index for h in search('The weather is lovely today.', {docs!r}, k=2)])")]
    )
    async with AsyncSession(
        model=model, preset="rlm", backend=kernel_backend, embeddings=shared
    ) as s:
        result = await s.run("rank")
    assert result.status == "success", result
    assert isinstance(result.output, list) and result.output[0] == 0


def test_rlm_eval_niah_semantic_is_solved_by_search(
    model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("rlm_eval", ROOT / "benchmarks" / "rlm_eval.py")
    assert spec is not None and spec.loader is not None
    rlm_eval = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("rlm_eval", rlm_eval)
    spec.loader.exec_module(rlm_eval)
    args = ["--fake", "--backend", "subprocess", "--tasks", "niah-semantic", "--lengths", "8k"]
    assert rlm_eval.main([*args, "--methods", "rlm", "--embeddings", str(model_dir)]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("8K"))
    assert row[1:4] == ["rlm", "1", "1.00"], out
    assert row[7] == "1.0"  # one sub-call: the best paragraph only
    with pytest.raises(SystemExit):
        rlm_eval.main(args)  # niah-semantic without --embeddings is a usage error
    assert "needs --embeddings" in capsys.readouterr().err


async def test_a_fork_keeps_embed_and_search_and_the_one_budget() -> None:
    emb = HashingEmbedder(dim=64)
    model = ScriptedModel(
        [code("a = len(embed(['x']))\nsubmit(a)"), code("submit(len(embed(['y'])))")]
    )
    async with AsyncSession(model=model, preset="rlm", backend="subprocess", embeddings=emb) as s:
        assert (await s.run("first")).output == 1
        fork = await s.fork()
        try:
            result = await fork.run("second")
        finally:
            await fork.aclose()
        spent = s.tracker.snapshot()
    assert result.status == "success" and result.output == 1, result
    assert spent.embedding_calls == 2  # the fork counted against the parent's tracker
