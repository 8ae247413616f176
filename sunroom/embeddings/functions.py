"""An embedder as host functions: ``embed`` and ``search`` for code in a kernel.

:func:`embedding_functions` turns one embedder (an :class:`~sunroom.embeddings.OnnxEmbedder`,
loaded once on the host and shared by every kernel and session that binds it) into two host
functions:

* ``embed(texts, kind="document") -> list[list[float]]``: one vector per text. The vectors
  cross the channel packed (``{"dim": d, "data": float32 bytes}``), not as msgpack floats; the
  kernel rebuilds them as :class:`sunroom.prelude.vectors.Vectors`, a list of rows.
* ``search(query, texts, k=10) -> list[Hit]``: the *k* texts most similar to *query* (cosine
  similarity: the query embedded as ``kind="query"``, the texts as documents, each normalised,
  ranked by dot product), best first. Only the hits cross the channel.

Limits, per call: at most :data:`MAX_TEXTS` texts and :data:`MAX_CHARS` characters for
``embed``, and an answer of at most :data:`MAX_VECTOR_BYTES` (a call past any of them is refused
with a ``ValueError`` saying which, before any work: split the texts into batches);
``search`` takes at most :data:`MAX_SEARCH_TEXTS` texts and :data:`MAX_SEARCH_CHARS`
characters, ``k`` from 1 to :data:`MAX_K`. ``search`` keeps document vectors in a least
recently used cache shared by every user of the same embedder (:data:`CACHE_ENTRIES` texts),
so searching the same chunks again embeds only the query; ``embed`` does not cache.

*before_call*, when given, runs on the event loop before each call embeds anything (after the
limits are checked) (an agent
session counts the call against its budget there, see
:meth:`~sunroom.agent.budget.BudgetTracker.count_embedding_call`); what it raises refuses the
call. Calls pass the registry's ordinary path otherwise: validation, hooks, events
(``HostCallStarted``/``HostCallFinished``), approvals.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Final, Literal, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt
import pydantic

from sunroom.sandbox.codegen import VECTORS
from sunroom.sandbox.functions import HostFunction, host_function

__all__ = [
    "CACHE_ENTRIES",
    "MAX_CHARS",
    "MAX_K",
    "MAX_SEARCH_CHARS",
    "MAX_SEARCH_TEXTS",
    "MAX_TEXTS",
    "MAX_VECTOR_BYTES",
    "Embedder",
    "Hit",
    "embedding_functions",
    "normalised",
    "pack",
    "rank",
]

MAX_TEXTS: Final = 4096
"""Most texts one ``embed`` call takes."""

MAX_CHARS: Final = 2_000_000
"""Most characters (all texts together) one ``embed`` call takes."""

MAX_VECTOR_BYTES: Final = 8 * 1024 * 1024
"""Most bytes of packed vectors one ``embed`` answer carries (half the channel's 16 MiB frame):
5,461 vectors of 384 dimensions, 2,048 of 1,024 (:data:`MAX_TEXTS` is lower for small models)."""

MAX_SEARCH_TEXTS: Final = 20_000
"""Most texts one ``search`` call ranks."""

MAX_SEARCH_CHARS: Final = 8_000_000
"""Most characters (all texts together) one ``search`` call ranks."""

MAX_K: Final = 1000
"""Most hits one ``search`` call returns."""

CACHE_ENTRIES: Final = 20_000
"""Document vectors ``search`` keeps per embedder (least recently used dropped first): 30 MB
of float32 at 384 dimensions."""

Kind: TypeAlias = Literal["document", "query"]

Packed: TypeAlias = Annotated[  # {"dim": d, "data": float32 bytes}; rows in the kernel
    Any,
    pydantic.WithJsonSchema(
        {
            "type": "array",
            "items": {"type": "array", "items": {"type": "number"}},
            "x-sunroom-python": VECTORS,
        }
    ),
]


class EmbedOutput(Protocol):
    """What an embedder returns: float32 vectors, one row per text."""

    @property
    def vectors(self) -> npt.NDArray[np.float32]:
        """An ``(n, dim)`` float32 array."""
        ...


class Embedder(Protocol):
    """The embedder these functions call (:class:`~sunroom.embeddings.OnnxEmbedder` is one)."""

    @property
    def name(self) -> str:
        """The model's name."""
        ...

    @property
    def dim(self) -> int:
        """The length of each vector."""
        ...

    async def aembed(
        self, texts: Sequence[str], *, kind: Kind = "document", prefix: str | None = None
    ) -> EmbedOutput:
        """One vector per text (never blocks the event loop)."""
        ...


@dataclasses.dataclass(frozen=True)
class Hit:
    """One ``search`` result: the text's position in ``texts``, its cosine similarity, itself."""

    index: int
    score: float
    text: str


def pack(vectors: npt.NDArray[Any]) -> dict[str, Any]:
    """``{"dim": d, "data": bytes}``: *vectors* (``(n, d)``) as little-endian float32."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    if rows.ndim != 2:
        raise ValueError(f"vectors must be a 2-D array, got {rows.ndim} dimensions")
    return {"dim": int(rows.shape[1]), "data": rows.tobytes()}


class _Cache:
    """Normalised document vectors by text, least recently used dropped past *size*."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._rows: collections.OrderedDict[str, npt.NDArray[np.float32]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()  # sessions on other loops (sync twins) share it

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, text: str) -> npt.NDArray[np.float32] | None:
        with self._lock:
            row = self._rows.get(text)
            if row is not None:
                self._rows.move_to_end(text)
            return row

    def put(self, text: str, row: npt.NDArray[np.float32]) -> None:
        with self._lock:
            self._rows[text] = row
            self._rows.move_to_end(text)
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)


_CACHES: weakref.WeakKeyDictionary[Any, _Cache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def document_cache(embedder: Embedder) -> _Cache:
    """The cache of document vectors shared by every user of *embedder*."""
    with _CACHES_LOCK:
        cache = _CACHES.get(embedder)
        if cache is None:
            cache = _CACHES[embedder] = _Cache(CACHE_ENTRIES)
        return cache


def rank(query: npt.NDArray[Any], documents: npt.NDArray[Any], k: int) -> list[tuple[int, float]]:
    """The *k* best ``(row, cosine similarity)`` of *documents* for the vector *query*.

    Best first, ties by lower row; neither input needs to be normalised.
    """
    if len(documents) == 0:
        return []
    scores = normalised(documents) @ normalised(query.reshape(1, -1))[0]
    top = min(k, len(scores))
    best = np.argpartition(-scores, top - 1)[:top]
    return sorted(((int(i), float(scores[i])) for i in best), key=lambda p: (-p[1], p[0]))


def normalised(vectors: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    """*vectors* (rows) scaled to unit length, as float32 (zero rows stay zero)."""
    rows = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out: npt.NDArray[np.float32] = rows / np.maximum(norms, np.float32(1e-12))
    return out


def _check_texts(name: str, texts: list[str], max_texts: int, max_chars: int) -> None:
    if len(texts) > max_texts:
        raise ValueError(
            f"{name}() takes at most {max_texts:,} texts per call, got {len(texts):,}: "
            "split them into batches"
        )
    chars = sum(map(len, texts))
    if chars > max_chars:
        raise ValueError(
            f"{name}() takes at most {max_chars:,} characters per call, got {chars:,}: "
            "split the texts into batches"
        )


def embedding_functions(
    embedder: Embedder, *, before_call: Callable[[str], None] | None = None
) -> list[HostFunction]:
    """``embed`` and ``search`` host functions calling *embedder* (see the module docstring).

    *before_call* is called with the function's name before each call does any work; what it
    raises refuses the call. The docstrings the kernel and the prompt see name the model by the
    last part of ``embedder.name`` (never a host directory).
    """
    dim = embedder.dim
    shown = embedder.name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]  # no host path
    max_rows = min(MAX_TEXTS, MAX_VECTOR_BYTES // (4 * dim))
    cache = document_cache(embedder)

    async def embed(texts: list[str], kind: Kind = "document") -> Packed:
        _check_texts("embed", texts, max_rows, MAX_CHARS)
        if before_call is not None:
            before_call("embed")
        if not texts:
            return pack(np.zeros((0, dim), dtype=np.float32))
        result = await embedder.aembed(texts, kind=kind)
        return pack(result.vectors)

    embed.__doc__ = (
        f"One embedding vector per text ({shown}, {dim} dimensions), in order.\n\n"
        'kind="query" for a search query, "document" (the default) for passages: the model may '
        f"prefix them differently. At most {max_rows:,} texts and {MAX_CHARS:,} characters per "
        "call (batch larger inputs); longer texts are truncated to the model's maximum length."
    )

    async def search(query: str, texts: list[str], k: int = 10) -> list[Hit]:
        if not 1 <= k <= MAX_K:
            raise ValueError(f"search() takes k from 1 to {MAX_K}, got {k}")
        _check_texts("search", texts, MAX_SEARCH_TEXTS, MAX_SEARCH_CHARS)
        if before_call is not None:
            before_call("search")
        if not texts:
            return []
        rows: list[npt.NDArray[np.float32] | None] = [cache.get(t) for t in texts]
        missing = list(dict.fromkeys(t for t, r in zip(texts, rows, strict=True) if r is None))
        fresh: dict[str, npt.NDArray[np.float32]] = {}
        for start in range(0, len(missing), max_rows):
            batch = missing[start : start + max_rows]
            got = normalised((await embedder.aembed(batch, kind="document")).vectors)
            for text, row in zip(batch, got, strict=True):
                fresh[text] = row
                cache.put(text, row)
        matrix = np.stack(
            [r if r is not None else fresh[t] for t, r in zip(texts, rows, strict=True)]
        )
        q = (await embedder.aembed([query], kind="query")).vectors[0]
        return [Hit(index=i, score=score, text=texts[i]) for i, score in rank(q, matrix, k)]

    search.__doc__ = (
        f"The k texts most similar in meaning to query ({shown} embeddings, cosine "
        "similarity from -1 to 1), best first. Use it to find the few chunks of a large text "
        "worth reading or passing to predict. Vectors of texts are cached by text, so searching "
        f"the same chunks again is cheap. At most {MAX_SEARCH_TEXTS:,} texts and "
        f"{MAX_SEARCH_CHARS:,} characters per call; k from 1 to {MAX_K}."
    )
    return [
        host_function(embed, idempotent=True),
        host_function(search, idempotent=True),
    ]
