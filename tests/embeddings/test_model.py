"""The test model itself: ONNX Runtime on the built graph against two independent references.

1. tests/embeddings/testmodel.py's plain numpy forward pass (float64, written apart from the
   ONNX graph) over the same weights: the hidden states agree to ~1e-6.
2. Published figures: sentence-transformers' own README prints the cosine similarity matrix of
   all-MiniLM-L6-v2 for three sentences, to four decimals (computed there with PyTorch):
   0.6660, 0.1046, 0.1411. Mean pooling plus L2 normalisation of our graph's output must give
   the same numbers, which shows the graph, tokenizer and pooling reproduce the trained model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import tokenizers

from tests.embeddings import testmodel

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!",
    "Stock markets fell sharply on Monday after the interest rate decision.",
]


def _encode(texts: list[str]) -> dict[str, npt.NDArray[np.int64]]:
    tok = tokenizers.Tokenizer.from_file(str(testmodel.model_dir() / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in enc], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64),
    }


def _ort_hidden(feeds: dict[str, npt.NDArray[np.int64]]) -> npt.NDArray[Any]:
    session = ort.InferenceSession(
        str(testmodel.model_dir() / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    out: npt.NDArray[Any] = session.run(["last_hidden_state"], feeds)[0]
    return out


def test_graph_has_the_bert_interface() -> None:
    session = ort.InferenceSession(
        str(testmodel.model_dir() / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    inputs = {i.name: (i.type, i.shape) for i in session.get_inputs()}
    assert inputs == {
        name: ("tensor(int64)", ["batch", "sequence"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    [out] = session.get_outputs()
    assert (out.name, out.shape) == ("last_hidden_state", ["batch", "sequence", 384])


def test_onnx_runtime_matches_the_numpy_pass() -> None:
    feeds = _encode(SENTENCES)  # padded: the mask matters
    assert feeds["attention_mask"].min() == 0
    got = _ort_hidden(feeds)
    want = testmodel.numpy_forward(testmodel.load_weights(), testmodel.load_config(), **feeds)
    live = feeds["attention_mask"].astype(bool)  # padding positions are never pooled
    assert got.shape == want.shape == (*feeds["input_ids"].shape, 384)
    assert np.abs(got[live] - want[live]).max() < 1e-4
    pooled_got = testmodel.mean_pool_normalise(got.astype(np.float64), feeds["attention_mask"])
    pooled_want = testmodel.mean_pool_normalise(want, feeds["attention_mask"])
    assert np.abs(pooled_got - pooled_want).max() < 1e-5


# sentence-transformers README (quickstart), model all-MiniLM-L6-v2, printed to 4 decimals
PUBLISHED_SENTENCES = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
]
PUBLISHED_SIMILARITIES = np.array(
    [[1.0000, 0.6660, 0.1046], [0.6660, 1.0000, 0.1411], [0.1046, 0.1411, 1.0000]]
)


def test_published_similarities_are_reproduced() -> None:
    feeds = _encode(PUBLISHED_SENTENCES)
    vecs = testmodel.mean_pool_normalise(
        _ort_hidden(feeds).astype(np.float64), feeds["attention_mask"]
    )
    assert np.abs(vecs @ vecs.T - PUBLISHED_SIMILARITIES).max() < 1e-4 + 5e-5  # 4-decimal rounding


def test_similarities_behave() -> None:
    feeds = _encode(SENTENCES)
    vecs = testmodel.mean_pool_normalise(
        _ort_hidden(feeds).astype(np.float64), feeds["attention_mask"]
    )
    sims = vecs @ vecs.T
    paraphrase, unrelated = sims[0, 1], sims[0, 3]
    assert paraphrase > 0.6
    assert unrelated < 0.2
    assert paraphrase - unrelated > 0.5
    assert np.allclose(np.diag(sims), 1.0)
