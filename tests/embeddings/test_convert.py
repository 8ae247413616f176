"""sunroom.embeddings.convert on the real checkpoint: the directory it writes, and what it refuses.

That the graph computes the trained model is tests/embeddings/test_model.py's job (ONNX Runtime
on it against a numpy pass written apart, and against the published similarities): the test
model directory it loads is this module's output (tests/embeddings/testmodel.py builds it with
the package's code).
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from sunroom.embeddings import OnnxEmbedder
from sunroom.embeddings.convert import CARRIED_FILES, convert_checkpoint, load_config
from sunroom.errors import EmbeddingModelError
from tests.embeddings import testmodel
from tests.embeddings.conftest import copy_model


def test_the_checkpoint_becomes_the_directory_an_embedder_loads(
    tmp_path: Path, model_dir: Path
) -> None:
    out = tmp_path / "out"
    convert_checkpoint(testmodel.source_dir(), out)
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted(["model.onnx", *CARRIED_FILES])
    for name in CARRIED_FILES:
        assert (out / name).read_bytes() == (testmodel.source_dir() / name).read_bytes()
    # the same weights give the same graph, byte for byte (the test model is built the same way)
    assert (out / "model.onnx").read_bytes() == (model_dir / "model.onnx").read_bytes()
    graph = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(graph)
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    with OnnxEmbedder(out) as embedder:
        assert embedder.dim == 384
        assert embedder.embed(["hello"]).vectors.shape == (1, 384)


def _checkpoint(tmp_path: Path, **config_changes: object) -> Path:
    """The real checkpoint (files linked), with config.json changed as given."""
    src = copy_model(testmodel.source_dir(), tmp_path / "ckpt", skip=("config.json",))
    config = {**load_config(testmodel.source_dir()), **config_changes}
    (src / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v != "-"}))
    return src


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model_type": "roberta"}, "has model_type 'roberta'"),
        ({"hidden_act": "relu"}, "has hidden_act 'relu'"),
        ({"position_embedding_type": "relative_key"}, "has position_embedding_type"),
        ({"num_hidden_layers": "-"}, "lacks the number num_hidden_layers"),
        ({"num_hidden_layers": 7}, "has no weight 'encoder.layer.6."),
    ],
)
def test_what_is_not_a_bert_encoder_is_refused_before_a_graph_is_written(
    tmp_path: Path, changes: dict[str, object], words: str
) -> None:
    out = tmp_path / "out"
    with pytest.raises(EmbeddingModelError, match=words.replace(".", r"\.")):
        convert_checkpoint(_checkpoint(tmp_path, **changes), out)
    assert not (out / "model.onnx").exists()


def test_a_checkpoint_without_tokenizer_or_readable_weights_is_refused(tmp_path: Path) -> None:
    no_tokenizer = copy_model(testmodel.source_dir(), tmp_path / "a", skip=("tokenizer.json",))
    with pytest.raises(EmbeddingModelError, match="has no tokenizer.json"):
        convert_checkpoint(no_tokenizer, tmp_path / "out-a")
    bad = copy_model(testmodel.source_dir(), tmp_path / "b", skip=("model.safetensors",))
    (bad / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(EmbeddingModelError, match="cannot be read as safetensors weights"):
        convert_checkpoint(bad, tmp_path / "out-b")
    not_json = copy_model(testmodel.source_dir(), tmp_path / "c", skip=("config.json",))
    (not_json / "config.json").write_text("{")
    with pytest.raises(EmbeddingModelError, match="cannot be read as JSON"):
        convert_checkpoint(not_json, tmp_path / "out-c")
