"""The codec shared by both ends: msgpack payloads in 4-byte big-endian length-prefixed frames.

Only msgpack types travel (nil, bool, int, float, str, bin, array, map) plus the Timestamp
extension for timezone-aware datetimes. Nothing is ever pickled. Decoding enforces a frame
size cap and a nesting depth cap; any violation raises :class:`WireError`.
"""

from __future__ import annotations

import struct

import msgpack

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Any, Final

PROTOCOL_VERSION: Final = 1
"""Bumped on any incompatible change to frames, message shapes or methods."""

DEFAULT_MAX_FRAME: Final = 16 * 1024 * 1024
"""Largest payload (bytes, excluding the 4-byte header) a peer accepts by default."""

DEFAULT_MAX_DEPTH: Final = 64
"""Deepest container nesting a peer accepts by default."""

HEADER: Final = struct.Struct(">I")


class WireError(Exception):
    """A frame or payload violates the codec (too big, too deep, not msgpack).

    Lives here, not in ``sunroom.errors``, because the kernel side imports only stdlib and
    msgpack; the host channel translates it to ``sunroom.errors.ProtocolError``.
    """


def encode(message: Any) -> bytes:
    """Serialise *message* to msgpack bytes; raises WireError for types msgpack cannot carry."""
    try:
        return msgpack.packb(message, use_bin_type=True, datetime=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode message: {exc}") from None


def frame(message: Any, *, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """Return the length-prefixed frame for *message*; raises WireError if it exceeds the cap."""
    payload = encode(message)
    if len(payload) > max_frame:
        raise WireError(f"frame of {len(payload)} bytes exceeds the {max_frame}-byte cap")
    return HEADER.pack(len(payload)) + payload


def take_frames(buf: bytearray, max_frame: int = DEFAULT_MAX_FRAME) -> list[bytes]:
    """Remove every complete frame from the front of *buf* and return their payloads.

    A partial frame stays in *buf*. Raises WireError as soon as a header claims more than
    *max_frame* bytes, before any of that payload is buffered.
    """
    payloads: list[bytes] = []
    pos, end = 0, len(buf)
    while end - pos >= 4:
        (size,) = HEADER.unpack_from(buf, pos)
        if size > max_frame:
            raise WireError(f"frame of {size} bytes exceeds the {max_frame}-byte cap")
        if end - pos - 4 < size:
            break
        payloads.append(bytes(buf[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    if pos:
        del buf[:pos]
    return payloads


def decode(payload: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Decode one msgpack payload, checking it is a single object nested at most *max_depth*."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False, timestamp=3)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WireError(f"undecodable payload: {type(exc).__name__}: {exc}") from None
    _check_depth(obj, max_depth)
    return obj


def _check_depth(obj: Any, max_depth: int) -> None:
    if not isinstance(obj, list | dict):
        return
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise WireError(f"payload nested deeper than {max_depth} levels")
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, list | dict):
                stack.append((child, depth + 1))
