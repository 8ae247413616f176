from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sunroom.rpc import (
    Notification,
    Request,
    Response,
    RpcError,
    WireError,
    decode,
    encode,
    frame,
    parse_message,
)
from sunroom.rpc.codec import HEADER

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
