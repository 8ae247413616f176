"""The streamed-bind encoding (host) and its decoding (kernel), without a kernel."""

from __future__ import annotations

import datetime

import msgpack
import pytest

from sunroom.prelude.inputs import Incoming
from sunroom.rpc.codec import WireError
from sunroom.sandbox import inputs


def _roundtrip(values: dict[str, object], size: int) -> dict[object, object]:
    chunks = [bytes(c) for c in inputs._chunks(values, size)]
    assert chunks and all(0 < len(c) <= size for c in chunks)
    incoming = Incoming()
    total = 0
    for i, chunk in enumerate(chunks):
        total = incoming.chunk({"data": chunk, "first": i == 0})
    return incoming.take(total)


@pytest.mark.parametrize("size", [1024, 4096, 1 << 20])
def test_streamed_values_decode_to_what_was_sent(size: int) -> None:
    when = datetime.datetime(2026, 11, 30, tzinfo=datetime.UTC)
    values: dict[str, object] = {
        "text": "é☀x" * 700_000,  # over SMALL_BYTES: header + UTF-8 view
        "blob": bytes(range(256)) * 5000,
        "docs": [f"doc {i}" for i in range(20_000)],
        "table": {f"k{i}": [i, None, True, 1.5, when] for i in range(10_000)},
        "nested": [[["deep"]], {"a": {"b": "c"}}],
        "empty_list": [],
        "empty_map": {},
        "n": 2**63 - 1,
    }
    assert _roundtrip(values, size) == values


def test_is_small_bounds_the_walk() -> None:
    assert inputs.is_small({"a": [1, 2, 3], "s": "x" * 1000})
    assert not inputs.is_small("x" * (inputs.SMALL_BYTES + 1))
    assert not inputs.is_small(list(range(inputs.SMALL_VALUES + 1)))
    assert not inputs.is_small([[0] * 10_000, [0] * 10_000])


def test_the_kernel_refuses_a_stream_of_the_wrong_size_or_with_extra_data() -> None:
    incoming = Incoming()
    received = incoming.chunk({"data": msgpack.packb({"a": 1}), "first": True})
    with pytest.raises(ValueError, match="announced"):
        incoming.take(received + 1)
    data = msgpack.packb({"a": 1}) + msgpack.packb(2)
    received = incoming.chunk({"data": data, "first": True})
    with pytest.raises(WireError):
        incoming.take(received)
    received = incoming.chunk({"data": msgpack.packb([1]), "first": True})
    with pytest.raises(ValueError, match="not a map"):
        incoming.take(received)


def test_a_first_chunk_drops_an_abandoned_stream() -> None:
    incoming = Incoming()
    incoming.chunk({"data": b"\xdf\x00\x00\x00\x05partial", "first": True})
    received = incoming.chunk({"data": msgpack.packb({"x": [1]}), "first": True})
    assert incoming.take(received) == {"x": [1]}


def test_too_deep_a_value_is_refused_by_the_kernel() -> None:
    deep: object = "leaf"
    for _ in range(200):
        deep = [deep]
    with pytest.raises(WireError):
        _roundtrip({"deep": deep, "pad": "x" * (inputs.SMALL_BYTES + 1)}, 1 << 20)
