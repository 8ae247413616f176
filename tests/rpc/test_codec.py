from __future__ import annotations

import datetime

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sunroom.rpc import (
    DEFAULT_MAX_VALUES,
    Decoding,
    Notification,
    Request,
    Response,
    RpcError,
    WireError,
    count_values,
    decode,
    encode,
    frame,
    parse_message,
)
from sunroom.rpc.codec import HEADER, Framer

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=50)
    | st.binary(max_size=50)
    | st.datetimes(timezones=st.just(datetime.UTC))
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
ids = st.integers(min_value=0, max_value=2**32 - 1)
methods = st.text(min_size=1, max_size=30)
errors = st.none() | st.builds(RpcError, st.text(max_size=20), st.text(max_size=40), values)
messages = (
    st.builds(Request, ids, methods, values)
    | st.builds(Response, ids, errors, values)
    | st.builds(Notification, methods, values)
)


@settings(max_examples=500)
@given(messages)
def test_every_message_shape_round_trips(msg: Request | Response | Notification) -> None:
    data = frame(msg.to_wire())
    (size,) = HEADER.unpack_from(data)
    assert size == len(data) - 4
    assert parse_message(decode(data[4:])) == msg


def test_frame_over_cap_is_refused() -> None:
    with pytest.raises(WireError, match="exceeds"):
        frame([2, "x", b"a" * 2000], max_frame=1024)


def test_depth_cap() -> None:
    deep: list[object] = []
    node = deep
    for _ in range(100):
        child: list[object] = []
        node.append(child)
        node = child
    with pytest.raises(WireError, match="nested deeper"):
        decode(encode(deep), max_depth=64)
    assert decode(encode([[[1]]]), max_depth=4) == [[[1]]]


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        encode({"a": 1}),
        encode([]),
        encode([9, 1, "x", None]),
        encode([0, -1, "m", None]),
        encode([0, 1, "", None]),
        encode([0, 1, 5, None]),
        encode([1, 1, "not a map", None]),
        encode([1, 1, {"type": 1, "message": "m"}, None]),
        encode([2, "m"]),
        encode([True, 1, "m", None]),
        encode(1) + encode(2),
    ],
)
def test_bad_payloads_raise_wire_error(bad: bytes) -> None:
    with pytest.raises(WireError):
        parse_message(decode(bad))


def test_unencodable_value() -> None:
    with pytest.raises(WireError, match="cannot encode"):
        encode(object())


# -- caps on what a frame may hold ---------------------------------------------------------------


def values_in(value: object) -> int:
    if isinstance(value, list):
        return 1 + sum(values_in(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(values_in(k) + values_in(v) for k, v in value.items())
    return 1


long_scalars = (
    st.text(min_size=200, max_size=400)
    | st.binary(min_size=250, max_size=300)
    | st.integers(min_value=2**32, max_value=2**64 - 1)
)


counted = st.recursive(
    scalars | long_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=500)
@given(counted)
def test_values_are_counted_exactly_without_decoding(value: object) -> None:
    payload = encode(value)
    assert count_values(payload, 1 << 30) == values_in(value)
    assert decode(payload, max_values=values_in(value)) == value


@settings(max_examples=200)
@given(values, st.sampled_from([1, 3, 64, 4096]))
def test_stepped_decoding_gives_the_same_value(value: object, step: int) -> None:
    decoding = Decoding(encode(value), max_values=1 << 20, step_values=step)
    while not decoding.step():
        pass
    assert decoding.value == value


def test_a_frame_over_the_value_cap_is_refused_before_anything_is_built() -> None:
    payload = encode([{}] * 300_000)
    with pytest.raises(WireError, match="more than 131072 values"):
        decode(payload, max_values=DEFAULT_MAX_VALUES)
    # the same frame shaped so that no single container is long
    nested = encode([[{}] * 65_535 for _ in range(5)])
    with pytest.raises(WireError, match="more than 131072 values"):
        decode(nested, max_values=DEFAULT_MAX_VALUES)
    # open arrays of short strings, each ending in the next one
    level = b"\xdd" + (90_001).to_bytes(4, "big") + b"\xa2ab" * 90_000
    with pytest.raises(WireError, match="more than 131072 values"):
        decode(level * 3 + b"\x90", max_values=DEFAULT_MAX_VALUES)


def test_legitimate_large_payloads_fit_the_caps() -> None:
    big = "x" * 15_000_000
    assert decode(encode(["call", big]), max_values=DEFAULT_MAX_VALUES) == ["call", big]
    strings = [f"short string {i}" for i in range(100_000)]
    payload = encode({"args": {"x": strings}})
    assert decode(payload, max_values=DEFAULT_MAX_VALUES) == {"args": {"x": strings}}
    assert len(frame([0, 1, "call", {"name": "f", "args": {"x": strings}}])) < 2_000_000


def test_a_peer_refuses_to_send_what_the_host_would_refuse() -> None:
    frame([2, "x", [None] * 100_000], max_values=DEFAULT_MAX_VALUES)
    with pytest.raises(WireError, match="more than 131072 values"):
        frame([2, "x", [None] * 200_000], max_values=DEFAULT_MAX_VALUES)


def test_container_lengths_are_capped_by_the_header() -> None:
    claim = b"\xdd" + (2**31).to_bytes(4, "big") + b"\xc0"  # an array claiming 2**31 elements
    with pytest.raises(WireError):
        decode(claim, max_values=DEFAULT_MAX_VALUES)


def test_depth_is_checked_bottom_up_across_siblings() -> None:
    assert decode(encode([[1], [[2]], [3]]), max_depth=3) == [[1], [[2]], [3]]
    with pytest.raises(WireError, match="nested deeper than 3"):
        decode(encode([[1], [[[2]]], [3]]), max_depth=3)
    with pytest.raises(WireError, match="nested deeper than 2"):
        decode(encode({"a": {"b": {"c": 1}}}), max_depth=2)
    wide: list[list[list[object]]] = [
        [[]] * 50_000
    ]  # many containers, shallow: no record per container needed
    assert decode(encode(wide), max_depth=3) == wide


@pytest.mark.parametrize(
    "bad",
    [
        msgpack.packb(msgpack.ExtType(5, b"x")),  # only the Timestamp extension is allowed
        b"\xc1",  # never used
        b"\x92\xc0",  # ends inside an array
        b"\xc0\xc0",  # two values
    ],
)
def test_bad_payloads_are_refused_by_both_paths(bad: bytes) -> None:
    with pytest.raises(WireError):
        decode(bad, max_values=DEFAULT_MAX_VALUES)
    with pytest.raises(WireError):
        decode_stepped(bad)


def decode_stepped(payload: bytes) -> object:
    decoding = Decoding(payload, max_values=DEFAULT_MAX_VALUES, step_values=1)
    while not decoding.step():
        pass
    return decoding.value


def test_values_are_counted_as_a_frame_arrives() -> None:
    """A dense 4 MiB frame is refused within its first 1.5 MiB, counted as 256 KiB reads land."""
    dense = encode([2, "stream", [{}] * (4 << 20)])
    decoding = Decoding(dense, max_values=DEFAULT_MAX_VALUES)
    refusal: WireError | None = None
    received = 0
    while refusal is None and received < len(dense):
        received += 256 << 10
        try:
            decoding.count_received(received)
        except WireError as exc:
            refusal = exc
    assert "more than 131072 values" in str(refusal)
    assert received <= 3 << 19
    # a value split by what has arrived so far waits for the rest
    split = encode(["x" * 200] * 1000)
    decoding = Decoding(split, max_values=500)
    decoding.count_received(300)
    with pytest.raises(WireError, match="more than 500 values"):
        decoding.count_received(len(split), steps=1000)


def test_the_kernels_framer_escapes_lone_surrogates_and_sends_only_utf8() -> None:
    message = [1, 7, None, {"value": "odd\ud800", "keys\udcff": ("x", "\U0001f600")}]
    with pytest.raises(WireError, match="surrogates not allowed"):
        Framer().frame(message)  # the host's framer: its own text must be valid
    data = Framer(escape_surrogates=True).frame(message)
    got = decode(data[HEADER.size :])  # the host decodes strings as strict UTF-8
    assert got == [1, 7, None, {"value": "odd\\ud800", "keys\\udcff": ["x", "\U0001f600"]}]
    assert Framer(escape_surrogates=True).frame([2, "stream", "ok"]) == frame([2, "stream", "ok"])
