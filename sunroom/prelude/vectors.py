"""Embedding vectors inside the kernel: packed float32 on the wire, rows of floats here.

The host's ``embed`` function (:mod:`sunroom.embeddings.functions`) answers with one map
``{"dim": d, "data": <n * d little-endian float32 bytes>}`` instead of a msgpack list of
floats: a tenth of the bytes to encode and decode. Its generated wrapper declares
:class:`Vectors` as its return type, so :func:`sunroom.rpc.wire.from_wire` hands the map to
:meth:`Vectors.__sunroom_from_wire__`, which rebuilds the rows with ``array('f')`` in C.
Standard library only.
"""

from __future__ import annotations

import sys
from array import array


class Vectors(list):  # type: ignore[type-arg]  # list[list[float]]; the kernel has no typing
    """Embedding vectors: a ``list`` of rows, each a ``list[float]`` of length :attr:`dim`."""

    dim: int = 0

    @staticmethod
    def __sunroom_from_wire__(value: object) -> object:
        """Rows from ``{"dim": d, "data": bytes}``; any other value is returned as it came."""
        if not isinstance(value, dict) or "data" not in value or "dim" not in value:
            return value
        dim, data = value["dim"], value["data"]
        if not isinstance(dim, int) or dim <= 0 or not isinstance(data, bytes):
            return value
        flat = array("f")
        if len(data) % (flat.itemsize * dim):
            raise ValueError(
                f"packed vectors of {len(data)} bytes do not divide into rows of {dim}"
            )
        flat.frombytes(data)
        if sys.byteorder != "little":
            flat.byteswap()
        items = flat.tolist()
        out = Vectors(items[i : i + dim] for i in range(0, len(items), dim))
        out.dim = dim
        return out
