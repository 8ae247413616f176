"""``embed`` and ``search`` as host functions, called from real kernels (subprocess, bwrap)."""

from __future__ import annotations

import ast

import numpy as np
import pytest

from sunroom import AsyncKernel
from sunroom.embeddings import OnnxEmbedder
from sunroom.embeddings import functions as ef
from sunroom.embeddings.functions import embedding_functions
from sunroom.eval import tasks as rlm_tasks
from sunroom.sandbox.codegen import generate
from tests.conftest import _require
from tests.embeddings import testmodel
from tests.embeddings.fake_embedder import HashingEmbedder
from tests.embeddings.test_model import PUBLISHED_SENTENCES, PUBLISHED_SIMILARITIES


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


# --- the real model (all-MiniLM-L6-v2 as ONNX; fixtures in tests/embeddings/conftest.py) -------


async def test_real_model_vectors_from_the_kernel_match_the_numpy_reference(
    kernel_backend: str, embedder: OnnxEmbedder
) -> None:
    sentences = ["A man is eating food.", "The new movie is awesome!", "ok"]
    async with AsyncKernel(backend=kernel_backend, functions=embedding_functions(embedder)) as k:
        r = await k.execute(
            f"v = embed({sentences!r})\n"
            "import array; array.array('f', [x for row in v for x in row]).tobytes().hex()"
        )
    assert r.ok, r
    assert r.value is not None
    got = np.frombuffer(bytes.fromhex(r.value.strip("'")), dtype=np.float32).reshape(3, 384)
    assert np.array_equal(got, embedder.embed(sentences).vectors)  # float32, bit for bit
    enc = embedder._tokenizer.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    hidden = testmodel.numpy_forward(
        testmodel.load_weights(), testmodel.load_config(), ids, mask, np.zeros_like(ids)
    )
    assert np.abs(got - testmodel.mean_pool_normalise(hidden, mask)).max() < 1e-5


async def test_real_model_search_scores_are_the_published_similarities(
    kernel_backend: str, embedder: OnnxEmbedder
) -> None:
    first, *rest = PUBLISHED_SENTENCES
    async with AsyncKernel(backend=kernel_backend, functions=embedding_functions(embedder)) as k:
        r = await k.execute(
            f"[(h.index, h.score, h.text) for h in search({first!r}, {rest!r}, k=5)]"
        )
    assert r.ok, r
    hits = ast.literal_eval(r.value or "")
    assert [h[0] for h in hits] == [0, 1]  # "It's so sunny outside!" first
    assert [h[2] for h in hits] == rest
    want = PUBLISHED_SIMILARITIES[0, 1:]  # sentence-transformers' published cosine similarities
    assert np.abs(np.array([h[1] for h in hits]) - want).max() < 1.5e-4


async def test_real_model_search_finds_the_paraphrased_needle(embedder: OnnxEmbedder) -> None:
    for task in rlm_tasks.make_tasks(["niah-semantic"], [20_000], samples=3, seed=0):
        paragraphs = [p for p in task.context.split("\n\n") if p.strip()]
        search = embedding_functions(embedder)[1]
        question = task.question.replace(" mentioned in the provided text", "")
        hits = await search.fn(query=question, texts=paragraphs, k=1)
        assert task.expected in hits[0].text, (task.question, hits[0])


def test_onnx_embedder_functions_are_embed_and_search(embedder: OnnxEmbedder) -> None:
    fns = embedder.functions()
    assert [f.name for f in fns] == ["embed", "search"]
    assert all(f.idempotent for f in fns)
    assert "384 dimensions" in fns[0].description


def test_the_prompt_never_shows_the_model_directory(embedder: OnnxEmbedder) -> None:
    for fn in embedder.functions():
        assert str(embedder.directory) not in fn.description
        assert "all-MiniLM-L6-v2" in fn.description  # the name, not the path
