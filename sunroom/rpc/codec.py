"""The codec shared by both ends: msgpack payloads in 4-byte big-endian length-prefixed frames.

Only msgpack types travel (nil, bool, int, float, str, bin, array, map) plus the Timestamp
extension for timezone-aware datetimes. Nothing is ever pickled. Decoding enforces, before or
while anything is built:

* a frame size cap (``max_frame``, checked on the header);
* a cap on the number of values in one frame (``max_values``; every scalar, array, map, map
  key and element counts), counted exactly on the raw bytes before decoding when the frame has
  more bytes than the cap, so a frame of millions of tiny values is refused without building
  one of them;
* per-container length caps derived from those two (msgpack refuses the header at once);
* a nesting depth cap (``max_depth``), checked while decoding in O(values) with no allocation
  per container;
* the Timestamp extension as the only extension type.

Any violation raises :class:`WireError`. :class:`Decoding` does the same work in bounded steps
so that an event loop can interleave other work with a large frame.
"""

from __future__ import annotations

import struct

import msgpack

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    import re
    from collections.abc import Iterable, Sequence
    from typing import Final, Protocol

    from typing_extensions import Buffer

    Bytes = bytes | bytearray | memoryview

    class _Packer(Protocol):
        def pack(self, obj: object, /) -> bytes: ...

    class _Unpacker(Protocol):
        def feed(self, data: Buffer, /) -> None: ...
        def unpack(self) -> object: ...


PROTOCOL_VERSION: Final = 3
"""Bumped on any incompatible change to frames, message shapes or methods (2: a fork's
descriptors come with its request; no ``fork_ready``)."""

DEFAULT_MAX_FRAME: Final = 16 * 1024 * 1024
"""Largest payload (bytes, excluding the 4-byte header) a peer accepts by default."""

DEFAULT_MAX_DEPTH: Final = 64
"""Deepest container nesting a peer accepts by default."""

DEFAULT_MAX_VALUES: Final = 131_072
"""Most msgpack values one frame from a kernel may hold (the host enforces it; the kernel
checks its own frames against it before sending). A list of 100,000 strings fits; decoding the
worst frame that fits costs the host ~10-20 ms of CPU, in slices, and ~10 MB."""

STEP_VALUES: Final = 4096
"""Values counted or decoded per :meth:`Decoding.step` (at most ~1 ms of CPU)."""

HEADER: Final = struct.Struct(">I")


class WireError(Exception):
    """A frame or payload violates the codec (too big, too deep, too many values, not msgpack).

    Lives here, not in ``sunroom.errors``, because the kernel side imports only stdlib and
    msgpack; the host channel translates it to ``sunroom.errors.ProtocolError``.
    """


def encode(message: object) -> bytes:
    """Serialise *message* to msgpack bytes; raises WireError for types msgpack cannot carry."""
    try:
        return msgpack.packb(message, use_bin_type=True, datetime=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode message: {exc}") from None


def frame(
    message: object, *, max_frame: int = DEFAULT_MAX_FRAME, max_values: int | None = None
) -> bytes:
    """Return the length-prefixed frame for *message*.

    Raises WireError if it exceeds *max_frame* bytes or, when given, *max_values* values (what
    the peer would refuse).
    """
    payload = encode(message)
    if len(payload) > max_frame:
        raise WireError(f"frame of {len(payload)} bytes exceeds the {max_frame}-byte cap")
    if max_values is not None and len(payload) > max_values:
        count_values(payload, max_values)
    return HEADER.pack(len(payload)) + payload


class Framer:
    r""":func:`frame` with one reusable msgpack packer (``packb`` builds a packer per call).

    Not thread-safe: use one per thread, or frame under a lock. A packer whose buffer grew past
    ``KEEP_BUFFER`` bytes (a large message) is replaced, so its memory is not held.

    *escape_surrogates* (the kernel's framer): a ``str`` UTF-8 cannot encode (one holding a
    lone surrogate, e.g. ``"\ud800"`` or a file name decoded with ``surrogateescape``) is
    sent with each such character written as a backslash escape, ``\ud800`` (six ASCII
    characters), as the kernel's ``print`` writes it; map keys too. Without it such a message
    raises WireError. Either way every string on the wire is valid UTF-8.
    """

    KEEP_BUFFER: Final = 64 * 1024

    __slots__ = ("_packer", "escape_surrogates", "max_frame", "max_values")

    def __init__(
        self,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_values: int | None = None,
        escape_surrogates: bool = False,
    ) -> None:
        self.max_frame = max_frame
        self.max_values = max_values
        self.escape_surrogates = escape_surrogates
        self._packer = _new_packer()

    def frame(self, message: object) -> bytes:
        """The length-prefixed frame for *message*; raises WireError as :func:`frame` does."""
        try:
            payload: bytes = self._packer.pack(message)
        except UnicodeEncodeError as exc:
            self._packer = _new_packer()  # whatever state the failed pack left
            if not self.escape_surrogates:
                raise WireError(f"cannot encode message: {exc}") from None
            payload = self._pack_escaped(message)
        except (TypeError, ValueError, OverflowError) as exc:
            self._packer = _new_packer()  # whatever state the failed pack left
            raise WireError(f"cannot encode message: {exc}") from None
        size = len(payload)
        if size > self.KEEP_BUFFER:
            self._packer = _new_packer()
        if size > self.max_frame:
            raise WireError(f"frame of {size} bytes exceeds the {self.max_frame}-byte cap")
        if self.max_values is not None and size > self.max_values:
            count_values(payload, self.max_values)
        return HEADER.pack(size) + payload

    def _pack_escaped(self, message: object) -> bytes:
        """*message* packed with its strings' lone surrogates escaped (the rare, slow path)."""
        try:
            payload: bytes = self._packer.pack(escape_surrogates(message))
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            self._packer = _new_packer()
            raise WireError(f"cannot encode message: {exc}"[:300]) from None
        return payload

    def frame_parts(self, message: object, tail: Sequence[Bytes]) -> list[Bytes]:
        """The frame of *message* with a binary of the buffers *tail* as its last value.

        *message* holds ``b""`` where the binary goes, and that must be the last value its
        encoding ends with (the last element of the outer list, or of a map that is last).
        Returns the frame as buffers to send one after the other: a head (the frame header
        and the encoding up to the binary's length) and then *tail* itself, never copied.
        Raises WireError as :meth:`frame` does, and for a *message* that does not end so.
        """
        head = self.frame(message)
        if not head.endswith(_EMPTY_BIN):
            raise WireError("the message must end with the empty binary the tail replaces")
        length = sum(memoryview(part).nbytes for part in tail)
        size = len(head) - 4 - len(_EMPTY_BIN) + _BIN32.size + length
        if size > self.max_frame:
            raise WireError(f"frame of {size} bytes exceeds the {self.max_frame}-byte cap")
        # a binary's length is its own bytes, so the value count stays that of the head
        start = HEADER.pack(size) + head[4 : -len(_EMPTY_BIN)] + _BIN32.pack(0xC6, length)
        out: list[Bytes] = [start]
        out += tail
        return out


_EMPTY_BIN: Final = b"\xc4\x00"
"""msgpack's encoding of ``b""`` (bin 8, length 0)."""

_BIN32: Final = struct.Struct(">BI")
"""msgpack's bin 32 header, packed as (0xC6, length)."""


def escape_surrogates(value: object) -> object:
    r"""*value* with every ``str`` in it (map keys too) made encodable as UTF-8.

    A character UTF-8 cannot encode (a lone surrogate) becomes its backslash escape:
    ``"a\ud800"`` becomes ``"a\\ud800"``. Lists, tuples and dicts are rebuilt (a tuple as a
    list, as msgpack sends it); every other value is returned as it is. Keys that become equal
    once escaped keep the last value.
    """
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [escape_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {escape_surrogates(k): escape_surrogates(v) for k, v in value.items()}
    return value


def _new_packer() -> _Packer:
    packer: _Packer = msgpack.Packer(use_bin_type=True, datetime=True, buf_size=4096)
    return packer


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
        with memoryview(buf) as view:  # one copy, not a bytearray slice and then bytes
            payloads.append(bytes(view[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    if pos:
        del buf[:pos]
    return payloads


def decode(
    payload: Buffer, *, max_depth: int = DEFAULT_MAX_DEPTH, max_values: int | None = None
) -> object:
    """Decode one msgpack payload within the caps (see the module docstring); raises WireError.

    *max_values* None means no value cap (the kernel trusts what the host sends).
    """
    if _small_and_shallow(payload, max_depth, max_values):
        return _unpackb(payload, _SMALL_OPTIONS)
    size = len(memoryview(payload))
    if max_values is not None and size > max_values:
        count_values(payload, max_values)
    return _unpackb(payload, _options(size, max_values, max_depth))


class Decoding:
    """One payload decoded in bounded steps: ``while not d.step(): yield``, then ``d.value``.

    Each step counts or decodes about ``step_values`` values (see :func:`decode` for the caps).
    The payload may still be arriving: :meth:`count_received` counts what is there already,
    so a frame over the value cap is refused before the rest of it is received. The received
    bytes must not change until the decoding is done. Raises WireError from both methods.
    """

    def __init__(
        self,
        payload: Buffer,
        *,
        max_depth: int = DEFAULT_MAX_DEPTH,
        max_values: int | None = None,
        step_values: int = STEP_VALUES,
    ) -> None:
        self._view = memoryview(payload).cast("B")
        self._size = len(self._view)
        self._step = step_values
        self._counter = (
            _Counter(self._view, max_values)
            if max_values is not None and self._size > max_values
            else None
        )
        self._options = _options(self._size, max_values, max_depth)
        self._unpacker: _Unpacker | None = None
        self._fed = 0
        self._chunk = 0
        self.value: object = None
        self.done = False

    def count_received(self, received: int, steps: int = 8) -> bool:
        """Count, in at most *steps* steps, the values within the first *received* bytes.

        Returns whether the count has caught up with them (False: call again).
        """
        if self._counter is None:
            return True
        self._counter.advance(steps * self._step, end=received)
        return self._counter.caught_up

    def step(self) -> bool:
        """Do a bounded amount of work; return True once ``value`` holds the decoded payload.

        The whole payload must have been received.
        """
        if self.done:
            return True
        if self._counter is not None:
            if not self._counter.advance(self._step):
                return False
            # values per byte is now known: feed about step_values values per step
            density = max(self._counter.count, 1) / max(self._size, 1)
            self._chunk = max(4096, int(self._step / density))
            self._counter = None
            return False
        if not self._chunk:
            self._chunk = max(4096, self._step)  # at most one value per byte
        if self._unpacker is None and self._chunk >= self._size:
            # one step decodes it all: straight from the payload, without the Unpacker's copy
            self.value = _unpackb(self._view, self._options)
            self.done = True
            self._view.release()
            return True
        if self._unpacker is None:
            self._unpacker = msgpack.Unpacker(max_buffer_size=max(self._size, 1), **self._options)
        end = min(self._size, self._fed + self._chunk)
        try:
            self._unpacker.feed(self._view[self._fed : end])
            self._fed = end
            self.value = self._unpacker.unpack()
        except msgpack.OutOfData:
            if self._fed < self._size:
                return False
            raise WireError("undecodable payload: the payload ends inside a value") from None
        except WireError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types for bad input
            raise WireError(f"undecodable payload: {type(exc).__name__}: {exc}"[:200]) from None
        if self._fed < self._size:
            raise WireError("undecodable payload: extra bytes after the value")
        self.done = True
        self._view.release()
        return True

    def close(self) -> None:
        """Let go of the payload (the decoding cannot go on)."""
        self._view.release()


def count_values(payload: Buffer, limit: int) -> int:
    """Count the msgpack values in *payload* without decoding it; raises WireError past *limit*.

    Runs of short values are counted by a regular expression (C speed, ~25-200 ns a value);
    strings and binaries longer than 255 bytes are skipped by their length. Bytes that start no
    value this protocol allows raise WireError too.
    """
    counter = _Counter(memoryview(payload).cast("B"), limit)
    while not counter.advance(1 << 30):
        pass
    return counter.count


# -- internals ---------------------------------------------------------------------------------


def _unpackb(payload: Buffer, options: dict[str, object]) -> object:
    """``msgpack.unpackb`` with *options*, every failure as WireError."""
    try:
        return msgpack.unpackb(payload, **options)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise WireError(f"undecodable payload: {type(exc).__name__}: {exc}"[:200]) from None


def _options(size: int, max_values: int | None, max_depth: int) -> dict[str, object]:
    longest = size if max_values is None else min(size, max_values)
    nesting = _Nesting(max_depth)
    return {
        "raw": False,
        "strict_map_key": False,
        "timestamp": 3,
        "max_str_len": size,
        "max_bin_len": size,
        "max_array_len": longest,
        "max_map_len": longest // 2,
        "max_ext_len": 12,  # the largest Timestamp form
        "ext_hook": _refuse_extension,
        "list_hook": nesting.array_done,
        "object_hook": nesting.map_done,
    }


_SMALL: Final = 4096
_CONTAINER_LEADS: Final = bytes(range(0x80, 0xA0)) + b"\xdc\xdd\xde\xdf"
"""Every byte that can start an array or a map (msgpack's fixmap/fixarray, 16- and 32-bit)."""


def _small_and_shallow(payload: Buffer, max_depth: int, max_values: int | None) -> bool:
    """Whether *payload* needs neither counting nor the depth hooks.

    True when it is small and holds too few bytes that can start a container to nest deeper
    than *max_depth*.
    """
    if type(payload) is not bytes or len(payload) > _SMALL:
        return False
    if max_values is not None and max_values < _SMALL:
        return False
    return len(payload) - len(payload.translate(None, _CONTAINER_LEADS)) <= max_depth


def _refuse_extension(code: int, data: bytes) -> object:
    raise WireError(f"extension type {code} is not allowed (only the Timestamp extension is)")


_SMALL_OPTIONS: Final = {
    "raw": False,
    "strict_map_key": False,
    "timestamp": 3,
    "max_str_len": _SMALL,
    "max_bin_len": _SMALL,
    "max_array_len": _SMALL,
    "max_map_len": _SMALL // 2,
    "max_ext_len": 12,
    "ext_hook": _refuse_extension,
}
"""Options for a payload of at most _SMALL bytes whose nesting needs no check."""

_IS_CONTAINER = frozenset((list, dict)).__contains__


class _Nesting:
    """Checks nesting depth from msgpack's hooks, bottom-up, without a record per container.

    msgpack calls a hook for each array and map as it completes, children before parents.
    ``pending`` holds the depth of every completed container whose parent has not completed
    yet; a container's container children are exactly the last entries of ``pending``.
    """

    __slots__ = ("limit", "pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.pending: list[int] = []

    def array_done(self, value: list[object]) -> list[object]:
        self._done(value)
        return value

    def map_done(self, value: dict[object, object]) -> dict[object, object]:
        self._done(value.values())  # keys are hashable, so never containers
        return value

    def _done(self, children: Iterable[object]) -> None:
        pending = self.pending
        inner = sum(map(_IS_CONTAINER, map(type, children))) if pending else 0
        if inner:
            depth = max(pending[-inner:]) + 1
            del pending[-inner:]
        else:
            depth = 1
        if depth > self.limit:
            raise WireError(f"payload nested deeper than {self.limit} levels")
        pending.append(depth)


def _any_bytes(count: int) -> bytes:
    if count == 0:
        return b""
    return rb"[\x00-\xff]" + (rb"{%d}" % count if count > 1 else b"")


def _token_pattern() -> bytes:
    """One msgpack value header plus any payload shorter than 256 bytes, as a regex."""
    fixstr = b"|".join(rb"\x%02x" % (0xA0 + n) + _any_bytes(n) for n in range(1, 32))
    short = b"|".join(rb"\x%02x" % n + _any_bytes(n) for n in range(256))
    return b"|".join(
        [
            # nil, bools, fixints, fixmap/fixarray headers (their elements count on their own),
            # the empty string
            rb"[\x00-\xa0\xc0\xc2\xc3\xe0-\xff]",
            fixstr,
            rb"[\xcc\xd0]" + _any_bytes(1),  # uint8, int8
            rb"[\xcd\xd1\xdc\xde]" + _any_bytes(2),  # uint16, int16, array16/map16 headers
            rb"[\xca\xce\xd2\xdd\xdf]" + _any_bytes(4),  # float32, (u)int32, array32/map32
            rb"[\xcb\xcf\xd3]" + _any_bytes(8),  # float64, (u)int64
            rb"[\xc4\xd9](?:" + short + b")",  # bin8, str8
            rb"\xd6\xff" + _any_bytes(4),  # Timestamp 32
            rb"\xd7\xff" + _any_bytes(8),  # Timestamp 64
            rb"\xc7\x0c\xff" + _any_bytes(12),  # Timestamp 96
        ]
    )


_RUN_LENGTH: Final = 1024
_LONGEST_SHORT_VALUE: Final = 2 + 255 + 5
"""Bytes the counter may need past a position to judge the value there."""
_PATTERNS: list[tuple[re.Pattern[bytes], re.Pattern[bytes], re.Pattern[bytes]]] = []
"""The counter's compiled patterns (:func:`_patterns`), once made."""


def _patterns() -> tuple[re.Pattern[bytes], re.Pattern[bytes], re.Pattern[bytes]]:
    """One value, exactly ``_RUN_LENGTH`` values, and up to that many, compiled on first use.

    Compiling them takes ~15 ms and ~0.5 MB: at import they were half of a kernel's start
    (and ``re`` itself, with the ``enum`` it imports, ~2 ms more).
    """
    if not _PATTERNS:
        import re

        source = _token_pattern()
        # Plain bounded repeats, not possessive ones: CPython 3.11.2's possessive repeat can
        # match a byte the repeated group does not. Nothing follows the repeat and each lead
        # byte fixes its value's length, so there is no other way to split the run to
        # backtrack into.
        _PATTERNS.append(
            (
                re.compile(source),
                re.compile(b"(?:%s){%d}" % (source, _RUN_LENGTH)),
                re.compile(b"(?:%s){0,%d}" % (source, _RUN_LENGTH)),
            )
        )
    return _PATTERNS[0]


class _Counter:
    """Exact, resumable count of the values in a payload (see :func:`count_values`)."""

    __slots__ = ("caught_up", "count", "limit", "pos", "view")

    def __init__(self, view: memoryview, limit: int) -> None:
        self.view = view
        self.limit = limit
        self.pos = 0
        self.count = 0
        self.caught_up = False  # the last advance stopped at its end, not for its budget

    def advance(self, budget: int, end: int | None = None) -> bool:
        """Count about *budget* more values among the first *end* bytes (default: all).

        True when the whole payload is counted. Values that may reach past *end* wait.
        """
        view, size, limit = self.view, len(self.view), self.limit
        token, full_run, some_run = _patterns()
        end = size if end is None else min(end, size)
        pos, count = self.pos, self.count
        goal = count + budget
        while pos < end and count < goal:
            start = pos
            full = full_run.match(view, pos, end)
            if full is not None:
                pos, count = full.end(), count + _RUN_LENGTH
            else:
                run = some_run.match(view, pos, end)  # matches always: it may be empty
                stop = pos if run is None else run.end()
                if stop > pos:
                    count += token.subn(b"", view[pos:stop])[1]
                    pos = stop
                while pos < end:  # strings and binaries of 256 bytes or more
                    lead = view[pos]
                    if (lead == 0xDA or lead == 0xC5) and pos + 3 <= end:
                        pos += 3 + int.from_bytes(view[pos + 1 : pos + 3], "big")
                    elif (lead == 0xDB or lead == 0xC6) and pos + 5 <= end:
                        pos += 5 + int.from_bytes(view[pos + 1 : pos + 5], "big")
                    else:
                        break
                    count += 1
                if pos == start:
                    if end < size and end - pos < _LONGEST_SHORT_VALUE:
                        break  # the value there may not have fully arrived yet
                    raise WireError(
                        f"byte 0x{view[pos]:02x} at offset {pos} does not start a complete "
                        "value the protocol allows"
                    )
            if count > limit:
                raise WireError(f"a frame holds more than {limit} values")
        self.pos, self.count = pos, count
        self.caught_up = count < goal or pos >= end
        if pos > size:
            raise WireError("undecodable payload: the payload ends inside a value")
        return pos >= size
