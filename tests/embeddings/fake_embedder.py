"""A fake embedder for the host-function plumbing: hashed bags of words, no model.

It honours the embedder contract the host functions rely on (``name``, ``dim``, ``aembed`` with
``kind``, float32 ``(n, dim)`` vectors) and counts what it embedded, so tests can see the
document cache at work. Texts sharing words get similar vectors. Tests of the real model use
``tests/embeddings/testmodel.py`` instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class FakeResult:
    vectors: npt.NDArray[np.float32]
    truncated: tuple[int, ...] = ()


class HashingEmbedder:
    """Unit vectors of hashed word counts; ``calls`` lists (kind, texts) of each embed."""

    def __init__(self, dim: int = 64) -> None:
        self.name = f"hashing-{dim}"
        self.dim = dim
        self.max_length = 512
        self.calls: list[tuple[str, list[str]]] = []

    def embed(self, texts: Sequence[str], *, kind: str = "document") -> FakeResult:
        self.calls.append((kind, list(texts)))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "big")
                out[row, h % self.dim] += 1.0
            norm = float(np.linalg.norm(out[row]))
            if norm:
                out[row] /= norm
        return FakeResult(out)

    async def aembed(
        self, texts: Sequence[str], *, kind: str = "document", prefix: str | None = None
    ) -> FakeResult:
        return await asyncio.to_thread(self.embed, texts, kind=kind)
