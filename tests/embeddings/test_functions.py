"""``embed`` and ``search`` as host functions, called from real kernels (subprocess, bwrap)."""

from __future__ import annotations

import pytest

from sunroom import AsyncKernel
from sunroom.embeddings import functions as ef
from sunroom.embeddings.functions import embedding_functions
from sunroom.sandbox.codegen import generate
from tests.conftest import _require
from tests.embeddings.fake_embedder import HashingEmbedder


@pytest.fixture(params=["subprocess", "bwrap"])
def kernel_backend(request: pytest.FixtureRequest) -> str:
    return _require(request.param)


async def test_embed_crosses_packed_and_arrives_as_rows(kernel_backend: str) -> None:
    emb = HashingEmbedder(dim=16)
    async with AsyncKernel(backend=kernel_backend, functions=embedding_functions(emb)) as k:
        r = await k.execute(
            "v = embed(['red apple', 'green apple', 'blue sky'])\n"
            "(type(v).__name__, isinstance(v, list), len(v), v.dim, "
            "all(type(x) is list and len(x) == 16 and type(x[0]) is float for x in v))"
        )
        assert r.ok, r
        assert r.value == "('Vectors', True, 3, 16, True)"
        r = await k.execute("[[round(x, 6) for x in row] for row in v]")
    want = emb.embed(["red apple", "green apple", "blue sky"]).vectors
    assert r.value == repr([[round(float(x), 6) for x in row] for row in want])


async def test_the_answer_is_packed_float32_not_a_list_of_floats() -> None:
    emb = HashingEmbedder(dim=8)
    embed = embedding_functions(emb)[0]
    packed = await embed.fn(texts=["a b", "c"])
    assert set(packed) == {"dim", "data"}
    assert packed["dim"] == 8 and isinstance(packed["data"], bytes)
    assert len(packed["data"]) == 2 * 8 * 4
    source = generate([embed]).source
    assert "from sunroom.prelude import vectors as _vectors" in source
    assert "-> _vectors.Vectors" in source


async def test_search_ranks_by_cosine_and_caches_documents(kernel_backend: str) -> None:
    emb = HashingEmbedder(dim=256)
    texts = ["the cat sat on the mat", "stock prices fell today", "a dog chased the cat"]
    async with AsyncKernel(backend=kernel_backend, functions=embedding_functions(emb)) as k:
        r = await k.execute(
            f"texts = {texts!r}\n"
            "hits = search('cat on a mat', texts, k=2)\n"
            "[(type(h).__name__, h.index, round(h.score, 3), h.text) for h in hits]"
        )
        assert r.ok, r
        assert r.value is not None and r.value.startswith("[('Hit', 0, ")
        assert "'stock prices fell today'" not in r.value
        documents = sum(len(t) for kind, t in emb.calls if kind == "document")
        r = await k.execute("[h.index for h in search('prices', texts, k=1)]")
        assert r.value == "[1]", r
    again = sum(len(t) for kind, t in emb.calls if kind == "document")
    assert again == documents  # the second search embedded only its query
    assert [kind for kind, _ in emb.calls].count("query") == 2


async def test_empty_input_and_k_larger_than_texts() -> None:
    emb = HashingEmbedder(dim=8)
    async with AsyncKernel(backend="subprocess", functions=embedding_functions(emb)) as k:
        r = await k.execute(
            "(embed([]), embed([]).dim, search('x', []), len(search('x', ['a'], k=5)))"
        )
        assert r.ok, r
        assert r.value == "([], 8, [], 1)"
    assert emb.calls == [("document", ["a"]), ("query", ["x"])]


@pytest.mark.parametrize(
    ("code", "error", "words"),
    [
        ("embed(['x'] * 100_000)", "ValueError", "at most 4,096 texts"),
        ("embed(['x' * 1_000_000] * 3)", "ValueError", "at most 2,000,000 characters"),
        ("embed(['ok', 3])", "HostFunctionArgumentError", "texts.1"),
        ("embed('just one string')", "HostFunctionArgumentError", "texts"),
        ("embed(['x'], kind='passage')", "HostFunctionArgumentError", "kind"),
        ("search('q', ['a'], k=0)", "ValueError", "k from 1 to 1000"),
        ("search('q', ['a'] * 20_001)", "ValueError", "at most 20,000 texts"),
        ("search(None, ['a'])", "HostFunctionArgumentError", "query"),
    ],
)
async def test_bad_input_is_a_clear_error_in_the_kernel(code: str, error: str, words: str) -> None:
    emb = HashingEmbedder(dim=8)
    async with AsyncKernel(backend="subprocess", functions=embedding_functions(emb)) as k:
        r = await k.execute(code)
    assert r.error is not None, r
    assert r.error.type == error, r.error
    assert words in r.error.message, r.error.message
    assert emb.calls == []  # refused before any work


def test_the_vector_cap_follows_the_dimension() -> None:
    wide = HashingEmbedder(dim=1024)
    embed = embedding_functions(wide)[0]
    assert "At most 2,048 texts" in embed.description
    narrow = embedding_functions(HashingEmbedder(dim=8))[0]
    assert f"At most {ef.MAX_TEXTS:,} texts" in narrow.description


async def test_the_cache_is_bounded_and_shared_per_embedder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emb = HashingEmbedder(dim=8)
    cache = ef.document_cache(emb)
    monkeypatch.setattr(cache, "size", 3)
    search = embedding_functions(emb)[1]
    await search.fn(query="q", texts=["a", "b", "c", "d", "e"], k=2)
    assert len(cache) == 3
    assert ef.document_cache(emb) is cache
    assert embedding_functions(emb)[1] is not search
    assert ef.document_cache(HashingEmbedder(dim=8)) is not cache


async def test_before_call_counts_and_may_refuse() -> None:
    emb = HashingEmbedder(dim=8)
    seen: list[str] = []

    def before(name: str) -> None:
        seen.append(name)
        if len(seen) > 2:
            raise PermissionError("no more embedding calls")

    fns = embedding_functions(emb, before_call=before)
    async with AsyncKernel(backend="subprocess", functions=fns) as k:
        r = await k.execute("embed(['a']); search('a', ['a', 'b']); embed(['c'])")
    assert seen == ["embed", "search", "embed"]
    assert r.error is not None and r.error.type == "PermissionError"
    assert len(emb.calls) == 3  # embed, search's documents and query; not the refused call
