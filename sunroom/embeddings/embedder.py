"""OnnxEmbedder: one ONNX Runtime session and one tokenizer turning texts into sentence vectors.

The embedder loads its model once (one ``InferenceSession``; a MiniLM-sized model loads in well
under a second) and is then shared: :meth:`OnnxEmbedder.embed` is thread-safe (the tokenizer
and the session are configured once at load and only read afterwards; ONNX Runtime's ``run`` may
be called from several threads) and :meth:`OnnxEmbedder.aembed` runs it on a worker thread.

Texts are embedded in batches of ``batch_size`` (texts of similar length together, results in
input order): each batch is tokenized, padded to its longest text, truncated at ``max_length``
tokens (the indices of truncated texts are reported, never hidden), run through the graph,
pooled as the model requires (mean over real tokens, the first token, the max, or the last real
token) and L2-normalised when the model says so. The graph's ``token_type_ids`` input is fed
only when the graph has it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from sunroom.embeddings.models import find_onnx, resolve_model
from sunroom.embeddings.profile import Profile, read_profile
from sunroom.errors import ClosedError, EmbeddingModelError, UsageError

if TYPE_CHECKING:
    from sunroom.sandbox.functions import HostFunction

__all__ = ["MAX_BATCH_SIZE", "MAX_CHARS", "MAX_TEXTS", "EmbedResult", "OnnxEmbedder"]

MAX_TEXTS = 50_000
"""Most texts one :meth:`OnnxEmbedder.embed` call takes."""
MAX_CHARS = 20_000_000
"""Most characters, summed over the texts, one call takes."""
MAX_BATCH_SIZE = 4096
"""The largest ``batch_size`` an embedder accepts."""
DEFAULT_MAX_LENGTH = 512
"""Token limit when neither the caller nor the model's files say one."""

Kind = Literal["document", "query"]


@dataclass(frozen=True, slots=True, eq=False)
class EmbedResult:
    """The vectors of one call, in input order, and which texts were cut.

    ``vectors`` is float32 of shape ``(n, dim)``, L2-normalised when the model requires it;
    ``truncated`` holds the indices of the texts longer than ``max_length`` tokens (their vector
    covers only the first ``max_length`` tokens, prefix included).
    """

    vectors: npt.NDArray[np.float32]
    truncated: tuple[int, ...]


class OnnxEmbedder:
    """A local embedding model: ONNX Runtime inference with a ``tokenizers`` tokenizer.

    ``model`` is a directory (``model.onnx`` or ``onnx/model.onnx``, ``tokenizer.json``, and
    optionally ``config.json`` and sentence-transformers' files) or a Hugging Face repo id
    ``org/name[@revision]`` resolved through the HF cache (``cache_dir``) and downloaded from
    ``endpoint`` when missing (see :mod:`sunroom.embeddings.models`). ``providers`` go to ONNX
    Runtime as given (each must be available); ``threads`` sets its intra-op thread count (None:
    its default, one per core). ``max_length`` caps tokens per text (default: the model's
    trained length, else its position table, else 512); ``query_prefix`` and
    ``document_prefix`` replace the model's default prefixes ("" for none).

    Raises :class:`UsageError` for bad arguments and :class:`EmbeddingModelError` when the
    model's files are missing, corrupt or disagree with each other.
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        threads: int | None = None,
        batch_size: int = 64,
        max_length: int | None = None,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        endpoint: str | None = None,
    ) -> None:
        if not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise UsageError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, not {batch_size}")
        if threads is not None and threads < 1:
            raise UsageError(f"threads must be at least 1 (or None), not {threads}")
        if max_length is not None and max_length < 2:
            raise UsageError(f"max_length must be at least 2 tokens, not {max_length}")
        import onnxruntime as ort

        available = set(ort.get_available_providers())
        missing = [p for p in providers if p not in available]
        if not providers or missing:
            raise UsageError(
                f"ONNX Runtime provider(s) {missing or '(none given)'} not available here; "
                f"available: {sorted(available)}"
            )
        started = time.perf_counter()
        directory = resolve_model(model, cache_dir=cache_dir, endpoint=endpoint)
        self.name: str = os.fspath(model)
        """The model as given (a directory or a repo id)."""
        self.directory: Path = directory
        """The directory the files were read from."""
        profile = read_profile(directory, self.name)
        self.profile: Profile = profile
        self._batch_size = batch_size
        self._query_prefix = profile.query_prefix if query_prefix is None else query_prefix
        self._document_prefix = (
            profile.document_prefix if document_prefix is None else document_prefix
        )
        limit = max_length or profile.max_length or profile.max_positions or DEFAULT_MAX_LENGTH
        if profile.max_positions is not None and limit > profile.max_positions:
            raise UsageError(
                f"max_length {limit} is more than the model's {profile.max_positions} positions"
            )
        self.max_length: int = limit
        """Most tokens per text (special tokens and prefix included); longer texts are cut."""
        self._tokenizer = _load_tokenizer(directory, limit)
        self._check_vocab(profile)
        self._session = _load_session(directory, providers, threads)
        inputs = {i.name for i in self._session.get_inputs()}
        needed = {"input_ids", "attention_mask"}
        unknown = inputs - needed - {"token_type_ids"}
        if not needed <= inputs or unknown:
            raise EmbeddingModelError(
                "the ONNX graph's inputs are not an encoder's (want input_ids, attention_mask "
                f"and optionally token_type_ids; it has {sorted(inputs)})"
            )
        self._token_types = "token_type_ids" in inputs
        outputs = [o.name for o in self._session.get_outputs()]
        preferred = ("last_hidden_state", "token_embeddings", "sentence_embedding")
        self._output = next((o for o in preferred if o in outputs), outputs[0])
        self._lock = threading.Lock()
        self._closed = False
        self.dim: int = self._probe(profile)
        """The length of each vector."""
        self.load_seconds: float = time.perf_counter() - started
        """Wall time the constructor took (resolution, tokenizer, session, probe)."""

    # --- loading checks ------------------------------------------------------------------------

    def _check_vocab(self, profile: Profile) -> None:
        size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        if profile.vocab_size is not None and size > profile.vocab_size:
            raise EmbeddingModelError(
                f"the tokenizer has {size} tokens but the model's embedding table has "
                f"{profile.vocab_size} (config.json): they do not belong together"
            )
        self._top_id = size - 1

    def _probe(self, profile: Profile) -> int:
        """Run the largest token id through the graph: catches a table smaller than the vocab."""
        ids = np.array([[self._top_id]], dtype=np.int64)
        try:
            out = self._run(ids, np.ones_like(ids))
        except EmbeddingModelError:
            raise
        except Exception as exc:  # ONNX Runtime's own error types are not importable stably
            raise EmbeddingModelError(
                f"the ONNX graph cannot embed the tokenizer's largest token id {self._top_id}: "
                "the tokenizer and the model do not belong together"
            ) from exc
        dim = int(out.shape[-1])
        if profile.hidden_size is not None and dim != profile.hidden_size:
            raise EmbeddingModelError(
                f"the ONNX graph gives vectors of {dim} but config.json says hidden_size "
                f"{profile.hidden_size}: the files do not belong together"
            )
        return dim

    # --- embedding -----------------------------------------------------------------------------

    def embed(
        self, texts: Sequence[str], *, kind: Kind = "document", prefix: str | None = None
    ) -> EmbedResult:
        """Embed ``texts`` (documents, or queries with ``kind="query"``); thread-safe.

        ``prefix`` replaces the model's prefix for ``kind`` in this call ("" for none). Raises
        :class:`UsageError` for an empty list, non-string items, more than :data:`MAX_TEXTS`
        texts or more than :data:`MAX_CHARS` characters, and :class:`ClosedError` after
        :meth:`close`.
        """
        items = _check_texts(texts)
        if kind not in ("document", "query"):
            raise UsageError(f"kind must be 'document' or 'query', not {kind!r}")
        if prefix is not None and not isinstance(prefix, str):
            raise UsageError("prefix must be a string or None")
        if self._closed:
            raise ClosedError("this embedder is closed")
        chosen = (
            prefix
            if prefix is not None
            else (self._query_prefix if kind == "query" else self._document_prefix)
        )
        if chosen:
            items = [chosen + t for t in items]
        # batches of similar lengths pad less; results go back to input order
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        vectors: npt.NDArray[np.float32] | None = None
        truncated: list[int] = []
        for start in range(0, len(order), self._batch_size):
            picked = order[start : start + self._batch_size]
            encodings = self._encode([items[i] for i in picked], picked)
            truncated.extend(i for i, e in zip(picked, encodings, strict=True) if e.overflowing)
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            types = np.array([e.type_ids for e in encodings], dtype=np.int64)
            pooled = self._pool(self._run(ids, mask, types), mask)
            if vectors is None:
                vectors = np.empty((len(items), pooled.shape[1]), dtype=np.float32)
            vectors[picked] = pooled
        assert vectors is not None  # items is never empty here
        return EmbedResult(vectors=vectors, truncated=tuple(sorted(truncated)))

    async def aembed(
        self, texts: Sequence[str], *, kind: Kind = "document", prefix: str | None = None
    ) -> EmbedResult:
        """:meth:`embed` on a worker thread (the event loop keeps running)."""
        return await asyncio.to_thread(self.embed, texts, kind=kind, prefix=prefix)

    def functions(self) -> list[HostFunction]:
        """``embed`` and ``search`` as host functions over this embedder (:mod:`.functions`)."""
        from sunroom.embeddings.functions import embedding_functions

        return embedding_functions(self)

    def close(self) -> None:
        """Release the session; later calls raise :class:`ClosedError`. Idempotent."""
        with self._lock:
            self._closed = True
            self._session = None

    def __enter__(self) -> OnnxEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OnnxEmbedder({self.name!r}, dim={self.dim}, max_length={self.max_length})"

    # --- internals -----------------------------------------------------------------------------

    def _encode(self, texts: list[str], indices: list[int]) -> list[Any]:
        try:
            encodings: list[object] = self._tokenizer.encode_batch(texts)
        except TypeError as exc:  # tokenizers refuses text that is not valid Unicode
            bad = next((i for i, t in zip(indices, texts, strict=True) if not _is_utf8(t)), None)
            if bad is None:
                raise
            raise UsageError(
                f"texts[{bad}] is not valid Unicode (it has a lone surrogate character)"
            ) from exc
        return encodings

    def _run(
        self,
        ids: npt.NDArray[np.int64],
        mask: npt.NDArray[np.int64],
        types: npt.NDArray[np.int64] | None = None,
    ) -> npt.NDArray[np.float32]:
        session = self._session
        if session is None:
            raise ClosedError("this embedder is closed")
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self._token_types:
            feeds["token_type_ids"] = np.zeros_like(ids) if types is None else types
        out: npt.NDArray[np.float32] = session.run([self._output], feeds)[0]
        if out.ndim not in (2, 3) or out.shape[0] != ids.shape[0]:
            raise EmbeddingModelError(
                f"the ONNX graph's output {self._output!r} has shape {out.shape}, "
                "not (batch, sequence, hidden) or (batch, hidden)"
            )
        return out.astype(np.float32, copy=False)

    def _pool(
        self, hidden: npt.NDArray[np.float32], mask: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float32]:
        mode = self.profile.pooling
        if hidden.ndim == 2:  # the graph pooled already
            pooled = hidden
        elif mode == "cls":
            pooled = hidden[:, 0, :]
        elif mode == "lasttoken":
            last = mask.sum(axis=1) - 1
            pooled = hidden[np.arange(hidden.shape[0]), last, :]
        elif mode == "max":
            pooled = np.where(mask[:, :, None] > 0, hidden, -np.inf).max(axis=1)
        else:
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        pooled = pooled.astype(np.float32, copy=False)
        if self.profile.normalize:
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = pooled / np.maximum(norms, 1e-12)
        return np.ascontiguousarray(pooled, dtype=np.float32)


def _check_texts(texts: object) -> list[str]:
    if isinstance(texts, str | bytes) or not isinstance(texts, Sequence):
        raise UsageError("texts must be a list of strings (not a single string)")
    if len(texts) == 0:
        raise UsageError("texts is empty: give at least one string to embed")
    if len(texts) > MAX_TEXTS:
        raise UsageError(f"{len(texts)} texts in one call is more than the limit of {MAX_TEXTS}")
    items = list(texts)
    bad = next((i for i, t in enumerate(items) if not isinstance(t, str)), None)
    if bad is not None:
        raise UsageError(
            f"texts[{bad}] is a {type(items[bad]).__name__}, not a string: every item must be str"
        )
    total = sum(map(len, items))
    if total > MAX_CHARS:
        raise UsageError(f"{total} characters in one call is more than the limit of {MAX_CHARS}")
    return items


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _load_tokenizer(directory: Path, max_length: int) -> Any:
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        raise EmbeddingModelError(f"the model directory has no tokenizer.json ({directory})")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise EmbeddingModelError("tokenizer.json in the model directory cannot be read") from exc
    padding = tokenizer.padding or {}
    pad_token = padding.get("pad_token")
    pad_id = padding.get("pad_id")
    if pad_token is None:
        for candidate in ("[PAD]", "<pad>", "<|endoftext|>"):
            if tokenizer.token_to_id(candidate) is not None:
                pad_token, pad_id = candidate, tokenizer.token_to_id(candidate)
                break
    tokenizer.enable_padding(pad_id=int(pad_id or 0), pad_token=str(pad_token or "[PAD]"))
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def _load_session(directory: Path, providers: Sequence[str], threads: int | None) -> Any:
    import onnxruntime as ort

    path = find_onnx(directory)
    if path is None:
        raise EmbeddingModelError(
            f"the model directory has no model.onnx or onnx/model.onnx ({directory})"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
    except Exception as exc:  # ONNX Runtime raises its own pybind types (Fail, InvalidProtobuf)
        raise EmbeddingModelError(
            f"{path.name} cannot be loaded by ONNX Runtime (corrupt or not an ONNX model)"
        ) from exc
