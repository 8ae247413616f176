"""OnnxEmbedder on the real test model: vectors, pooling, batching, prefixes, limits, bad models."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from sunroom.embeddings import MAX_CHARS, MAX_TEXTS, EmbedResult, OnnxEmbedder
from sunroom.embeddings.convert import write_onnx
from sunroom.embeddings.embedder import MAX_BATCH_SIZE
from sunroom.embeddings.profile import BGE_QUERY, read_profile
from sunroom.errors import ClosedError, EmbeddingModelError, UsageError
from tests.embeddings import testmodel
from tests.embeddings.conftest import copy_model
from tests.embeddings.test_model import PUBLISHED_SENTENCES, PUBLISHED_SIMILARITIES

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "Stock markets fell sharply on Monday after the interest rate decision was announced.",
    "ok",
]


def test_vectors_reproduce_the_published_similarities(embedder: OnnxEmbedder) -> None:
    result = embedder.embed(PUBLISHED_SENTENCES)
    assert isinstance(result, EmbedResult)
    assert result.vectors.dtype == np.float32
    assert result.vectors.shape == (3, 384) == (3, embedder.dim)
    assert np.allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=1e-6)
    assert np.abs(result.vectors @ result.vectors.T - PUBLISHED_SIMILARITIES).max() < 1.5e-4
    assert result.truncated == ()


def test_vectors_match_the_numpy_reference(embedder: OnnxEmbedder, model_dir: Path) -> None:
    tok = embedder._tokenizer
    enc = tok.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    hidden = testmodel.numpy_forward(
        testmodel.load_weights(), testmodel.load_config(), ids, mask, np.zeros_like(ids)
    )
    want = testmodel.mean_pool_normalise(hidden, mask)
    got = embedder.embed(SENTENCES).vectors
    assert np.abs(got - want).max() < 1e-5


def test_batching_and_order_do_not_change_vectors(model_dir: Path, embedder: OnnxEmbedder) -> None:
    texts = SENTENCES * 3
    whole = embedder.embed(texts).vectors
    with OnnxEmbedder(model_dir, batch_size=2, threads=1) as small:
        pieces = small.embed(texts).vectors
    assert np.abs(whole - pieces).max() < 1e-5
    assert np.abs(whole[:5] - whole[5:10]).max() < 1e-5  # input order kept
    single = embedder.embed([SENTENCES[3]]).vectors[0]
    assert np.abs(single - whole[3]).max() < 1e-5  # padding never leaks into a vector


def test_truncation_is_reported(model_dir: Path) -> None:
    long = "word " * 40
    with OnnxEmbedder(model_dir, max_length=16) as emb:
        assert emb.max_length == 16
        result = emb.embed(["short one", long, "another short", long + "x"])
        assert result.truncated == (1, 3)
        # a truncated text embeds as its first max_length tokens: both long texts agree
        assert np.abs(result.vectors[1] - result.vectors[3]).max() < 1e-5


def test_max_length_defaults_and_limits(model_dir: Path, embedder: OnnxEmbedder) -> None:
    assert embedder.max_length == 256  # sentence_bert_config.json's max_seq_length
    with pytest.raises(UsageError, match="512 positions"):
        OnnxEmbedder(model_dir, max_length=513)
    with pytest.raises(UsageError, match="max_length"):
        OnnxEmbedder(model_dir, max_length=1)


def test_prefixes_by_kind_and_per_call(model_dir: Path, embedder: OnnxEmbedder) -> None:
    text = ["how do I bake bread"]
    with OnnxEmbedder(model_dir, query_prefix="query: ", document_prefix="passage: ") as emb:
        q = emb.embed(text, kind="query").vectors
        d = emb.embed(text).vectors
        plain = emb.embed(text, prefix="").vectors
        custom = emb.embed(text, kind="query", prefix="search: ").vectors
    assert np.abs(q - embedder.embed(["query: " + text[0]]).vectors).max() < 1e-5
    assert np.abs(d - embedder.embed(["passage: " + text[0]]).vectors).max() < 1e-5
    assert np.abs(plain - embedder.embed(text).vectors).max() < 1e-5
    assert np.abs(custom - embedder.embed(["search: " + text[0]]).vectors).max() < 1e-5
    # MiniLM has no prefixes: query and document vectors are the same
    assert (
        np.abs(embedder.embed(text, kind="query").vectors - embedder.embed(text).vectors).max()
        < 1e-6
    )


def test_the_graph_without_token_type_ids_is_fed_without_it(
    tmp_path: Path, model_dir: Path, embedder: OnnxEmbedder
) -> None:
    variant = copy_model(model_dir, tmp_path / "no-types", skip=("model.onnx",))
    write_onnx(
        testmodel.load_weights(), testmodel.load_config(), variant / "model.onnx", token_types=False
    )
    with OnnxEmbedder(variant) as emb:
        assert not emb._token_types
        got = emb.embed(SENTENCES).vectors
    assert np.abs(got - embedder.embed(SENTENCES).vectors).max() < 1e-5


def test_cls_pooling_and_no_normalisation_from_the_files(tmp_path: Path, model_dir: Path) -> None:
    variant = copy_model(
        model_dir, tmp_path / "cls", skip=("1_Pooling/config.json", "modules.json")
    )
    (variant / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 384, "pooling_mode_cls_token": True})
    )
    (variant / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                }
            ]
        )
    )
    with OnnxEmbedder(variant) as emb:
        assert (emb.profile.pooling, emb.profile.normalize) == ("cls", False)
        enc = emb._tokenizer.encode_batch(SENTENCES[:2])
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        hidden = testmodel.numpy_forward(
            testmodel.load_weights(), testmodel.load_config(), ids, mask, np.zeros_like(ids)
        )
        got = emb.embed(SENTENCES[:2]).vectors
    assert np.abs(got - hidden[:, 0, :]).max() < 1e-4
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0)


@pytest.mark.parametrize(
    ("name", "query", "document", "pooling"),
    [
        ("intfloat/multilingual-e5-small", "query: ", "passage: ", "mean"),
        ("nomic-ai/nomic-embed-text-v1.5", "search_query: ", "search_document: ", "mean"),
        ("BAAI/bge-small-en-v1.5", BGE_QUERY, None, "cls"),
        ("sentence-transformers/all-MiniLM-L6-v2", None, None, "mean"),
    ],
)
def test_family_defaults(
    tmp_path: Path, name: str, query: str | None, document: str | None, pooling: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 384}))
    profile = read_profile(tmp_path, name)
    assert (profile.query_prefix, profile.document_prefix, profile.pooling) == (
        query,
        document,
        pooling,
    )
    assert profile.normalize
    # sentence-transformers' prompts in the directory win over the family table
    (tmp_path / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "Q: ", "document": ""}})
    )
    profile = read_profile(tmp_path, name)
    assert (profile.query_prefix, profile.document_prefix) == ("Q: ", None)


def test_aembed_and_threads_agree(embedder: OnnxEmbedder) -> None:
    want = embedder.embed(SENTENCES).vectors
    got = asyncio.run(embedder.aembed(SENTENCES)).vectors
    assert np.abs(got - want).max() < 1e-6
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                results.append(embedder.embed(SENTENCES).vectors)
        except BaseException as exc:  # reported below, never swallowed
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 12
    assert all(np.abs(r - want).max() < 1e-5 for r in results)


async def test_aembed_in_a_running_loop(embedder: OnnxEmbedder) -> None:
    a, b = await asyncio.gather(embedder.aembed(["one"]), embedder.aembed(["two"], kind="query"))
    assert a.vectors.shape == b.vectors.shape == (1, 384)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ([], "empty"),
        ("just a string", "not a single string"),
        (["fine", 3, "x"], r"texts\[1\] is a int"),
        (["fine", None], r"texts\[1\] is a NoneType"),
        (["fine", "also fine", "bad \ud800 half a pair"], r"texts\[2\] is not valid Unicode"),
        (["x"] * (MAX_TEXTS + 1), f"more than the limit of {MAX_TEXTS}"),
        (["a" * 1_000_000] * 21, f"more than the limit of {MAX_CHARS}"),
    ],
)
def test_bad_input_is_a_usage_error(embedder: OnnxEmbedder, texts: object, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        embedder.embed(texts)  # type: ignore[arg-type]


def test_a_hundred_thousand_texts_are_refused_before_any_work(embedder: OnnxEmbedder) -> None:
    with pytest.raises(UsageError, match="100000 texts"):
        embedder.embed(["short"] * 100_000)


def test_bad_arguments(model_dir: Path, embedder: OnnxEmbedder) -> None:
    with pytest.raises(UsageError, match="kind"):
        embedder.embed(["x"], kind="passage")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="batch_size"):
        OnnxEmbedder(model_dir, batch_size=MAX_BATCH_SIZE + 1)
    with pytest.raises(UsageError, match="threads"):
        OnnxEmbedder(model_dir, threads=0)
    with pytest.raises(UsageError, match="NoSuchExecutionProvider"):
        OnnxEmbedder(model_dir, providers=["NoSuchExecutionProvider"])
    with pytest.raises(UsageError, match="neither a local directory"):
        OnnxEmbedder(str(model_dir / "missing"))


def test_closed_means_closed(model_dir: Path) -> None:
    emb = OnnxEmbedder(model_dir)
    emb.close()
    emb.close()
    with pytest.raises(ClosedError):
        emb.embed(["x"])
    with pytest.raises(ClosedError):
        asyncio.run(emb.aembed(["x"]))


def test_load_is_fast_and_said(model_dir: Path) -> None:
    with OnnxEmbedder(model_dir) as emb:
        # issue 16's target is 1 s for a MiniLM-sized model; 3 s leaves room for a busy machine
        assert 0 < emb.load_seconds < 3.0
        assert repr(emb).startswith("OnnxEmbedder(")


# --- models that are broken or do not belong together -------------------------------------


def test_a_corrupt_model_file(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "corrupt", skip=("model.onnx",))
    (bad / "model.onnx").write_bytes(b"\x08\x07not an onnx graph" * 100)
    with pytest.raises(EmbeddingModelError, match="cannot be loaded by ONNX Runtime"):
        OnnxEmbedder(bad)


def test_a_truncated_model_file(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "short", skip=("model.onnx",))
    (bad / "model.onnx").write_bytes((model_dir / "model.onnx").read_bytes()[:1_000_000])
    with pytest.raises(EmbeddingModelError, match="cannot be loaded"):
        OnnxEmbedder(bad)


def test_no_onnx_file(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "none", skip=("model.onnx",))
    with pytest.raises(EmbeddingModelError, match="no model.onnx"):
        OnnxEmbedder(bad)


def test_onnx_in_the_onnx_subdirectory(tmp_path: Path, model_dir: Path) -> None:
    alt = copy_model(model_dir, tmp_path / "alt", skip=("model.onnx",))
    (alt / "onnx").mkdir()
    (alt / "onnx" / "model.onnx").hardlink_to(model_dir / "model.onnx")
    with OnnxEmbedder(alt) as emb:
        assert emb.dim == 384


def test_a_missing_tokenizer(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "notok", skip=("tokenizer.json",))
    with pytest.raises(EmbeddingModelError, match=r"no tokenizer\.json"):
        OnnxEmbedder(bad)


def test_an_unreadable_tokenizer(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "badtok", skip=("tokenizer.json",))
    (bad / "tokenizer.json").write_text('{"version": "1.0", "model": 7}')
    with pytest.raises(EmbeddingModelError, match="cannot be read"):
        OnnxEmbedder(bad)


def _bigger_tokenizer(src: Path, dest: Path, extra: int) -> None:
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_tokens([AddedToken(f"zzextra{i}", single_word=True) for i in range(extra)])
    tok.save(str(dest / "tokenizer.json"))


def test_tokenizer_bigger_than_the_config_vocab(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "vocab", skip=("tokenizer.json",))
    _bigger_tokenizer(model_dir, bad, 10)
    with pytest.raises(
        EmbeddingModelError, match="30532 tokens but the model's embedding table has 30522"
    ):
        OnnxEmbedder(bad)


def test_tokenizer_bigger_than_the_graph_table_without_a_config(
    tmp_path: Path, model_dir: Path
) -> None:
    # no config.json to compare with: the probe through the graph itself finds it
    bad = copy_model(model_dir, tmp_path / "vocab2", skip=("tokenizer.json", "config.json"))
    _bigger_tokenizer(model_dir, bad, 10)
    with pytest.raises(EmbeddingModelError, match="largest token id 30531"):
        OnnxEmbedder(bad)


def test_hidden_size_other_than_the_config(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "hidden", skip=("config.json",))
    config = json.loads((model_dir / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "hidden_size": 768}))
    with pytest.raises(
        EmbeddingModelError, match="vectors of 384 but config.json says hidden_size 768"
    ):
        OnnxEmbedder(bad)


def test_a_config_that_is_not_json(tmp_path: Path, model_dir: Path) -> None:
    bad = copy_model(model_dir, tmp_path / "json", skip=("config.json",))
    (bad / "config.json").write_text("{not json")
    with pytest.raises(
        EmbeddingModelError, match="config.json in the model directory is not valid JSON"
    ):
        OnnxEmbedder(bad)
