"""What the host accepts from a kernel: every message checked before use, never raised raw."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest

from sunroom.rpc import schema
from sunroom.rpc.codec import WireError

GOOD_RESULT: dict[str, Any] = {
    "stdout": "out",
    "stderr": "",
    "value": "1",
    "error": None,
    "duration_s": 0.5,
    "truncated_bytes": 0,
    "outputs": [],
    "dropped_outputs": 0,
}

PNG_ITEM: dict[str, Any] = {
    "output_type": "display_data",
    "data": {"image/png": b"\x89PNG", "text/plain": "<Figure>", "application/json": {"a": [1]}},
    "metadata": {"sunroom": {"errors": {"text/html": "ValueError: no"}}},
}


def with_(**changes: Any) -> dict[str, Any]:
    return {**GOOD_RESULT, **changes}


def test_a_good_execute_result_is_rebuilt_with_known_keys_only() -> None:
    check = schema.execute_result(1000)
    assert check(with_(extra={"ignored": [1, 2]})) == GOOD_RESULT
    error = {"type": "ValueError", "message": "m", "traceback": "tb", "more": 1}
    out = check(with_(error=error, duration_s=2))
    assert out["error"] == {"type": "ValueError", "message": "m", "traceback": "tb"}
    assert out["duration_s"] == 2.0


@pytest.mark.parametrize(
    "bad",
    [
        42,
        None,
        [1, 2],
        "result",
        {"stdout": "x"},
        with_(stdout=b"raw"),
        with_(stdout=["a"]),
        with_(stderr=None),
        with_(value=7),
        with_(value=b"7"),
        with_(error="boom"),
        with_(error=["TypeError", "m", "tb"]),
        with_(error={"type": "X", "message": "y"}),
        with_(error={"type": 1, "message": "y", "traceback": ""}),
        with_(error={"type": "X", "message": "y", "traceback": 5}),
        with_(duration_s="long"),
        with_(duration_s=-1.0),
        with_(duration_s=math.nan),
        with_(duration_s=True),
        with_(truncated_bytes=-1),
        with_(truncated_bytes=1.5),
        with_(truncated_bytes=False),
        with_(stdout="x" * (1000 + schema.OUTPUT_MARKER_SLACK + 1)),
        with_(outputs="png"),
        with_(outputs=[1]),
        with_(outputs=[{**PNG_ITEM, "output_type": "stream"}]),
        with_(outputs=[{**PNG_ITEM, "data": {"image/png": "iVBOR", "text/plain": "x"}}]),
        with_(outputs=[{**PNG_ITEM, "data": {"text/html": b"<b>", "text/plain": "x"}}]),
        with_(outputs=[{**PNG_ITEM, "data": {"image/png": b"x"}}]),  # no text/plain
        with_(outputs=[{**PNG_ITEM, "data": {"application/json": {1: 2}, "text/plain": "x"}}]),
        with_(outputs=[{**PNG_ITEM, "metadata": [1]}]),
        with_(outputs=[{**PNG_ITEM, "metadata": {"x": b"bytes"}}]),
        with_(outputs=[PNG_ITEM] * (schema.MAX_DISPLAY_ITEMS + 1)),
        with_(outputs=[{**PNG_ITEM, "data": {"image/png": b"x" * 5000, "text/plain": "x"}}]),
        with_(dropped_outputs=-1),
    ],
)
def test_malformed_execute_results_are_wire_errors(bad: Any) -> None:
    with pytest.raises(WireError):
        schema.execute_result(1000, 1000)(bad)


def test_display_items_are_rebuilt_with_known_keys_only() -> None:
    check = schema.execute_result(1000, 1000)
    extra = {**PNG_ITEM, "more": 1}
    out = check(with_(outputs=[extra, extra], dropped_outputs=3))
    assert out["outputs"] == [PNG_ITEM, PNG_ITEM]
    assert out["dropped_outputs"] == 3
    legacy = dict(GOOD_RESULT)
    del legacy["outputs"], legacy["dropped_outputs"]
    assert check(legacy) == GOOD_RESULT  # a result without them has none


def test_notifications() -> None:
    assert schema.stream({"name": "stderr", "text": "t", "x": 1}) == {"name": "stderr", "text": "t"}
    hello = {"protocol": 1, "pid": 7, "python": "3.11.2", "nonce": "ab", "more": [1]}
    assert schema.hello(hello) == {"protocol": 1, "pid": 7, "python": "3.11.2", "nonce": "ab"}
    assert schema.hello({}) == {}  # the launcher refuses a hello without its values
    bad_streams: tuple[Any, ...] = (
        None,
        [],
        {"name": "stdin", "text": "t"},
        {"name": "stdout", "text": b"t"},
        {"name": "stdout"},
    )
    for bad in bad_streams:
        with pytest.raises(WireError):
            schema.stream(bad)
    bad_hellos: tuple[Any, ...] = (
        [],
        {"protocol": "1"},
        {"pid": 0},
        {"pid": "7"},
        {"nonce": "n" * 257},
        {"python": 3},
    )
    for bad_hello in bad_hellos:
        with pytest.raises(WireError):
            schema.hello(bad_hello)
    assert schema.forked({"pid": 12, "more": 1}) == {"pid": 12}
    for bad_forked in ({}, {"pid": 0}, {"pid": "12"}, {"pid": True}, [12]):
        with pytest.raises(WireError):
            schema.forked(bad_forked)
    assert set(schema.NOTIFICATIONS) == {"hello", "stream", "forked"}


def test_fork_result() -> None:
    assert schema.pids([5, 9]) == [5, 9]
    bad_results: tuple[Any, ...] = (None, {}, [0], ["7"], [True, 3.5])
    for bad in bad_results:
        with pytest.raises(WireError):
            schema.pids(bad)


def test_call_params() -> None:
    assert schema.call({"name": "f", "args": {"x": 1}, "x": 2}) == {"name": "f", "args": {"x": 1}}
    assert schema.call({"name": "f" * 128, "args": {}})["name"] == "f" * 128
    bad_calls: tuple[Any, ...] = (
        None,
        {"args": {}},
        {"name": "", "args": {}},
        {"name": "f" * 129, "args": {}},
        {"name": 5, "args": {}},
        {"name": "f"},
        {"name": "f", "args": [1]},
        {"name": "f", "args": {1: 2}},
    )
    for bad in bad_calls:
        with pytest.raises(WireError):
            schema.call(bad)


def test_results_of_install_bind_and_variables() -> None:
    assert schema.names(["a", "b"]) == ["a", "b"]
    row = {"name": "x", "type": "int", "repr": "1"}
    assert schema.variables([{**row, "extra": 1}]) == [row]
    for bad_names in (None, "ab", [1], [b"a"]):
        with pytest.raises(WireError):
            schema.names(bad_names)
    for bad_rows in (None, [1], [{"name": "x"}], [{**row, "repr": 1}]):
        with pytest.raises(WireError):
            schema.variables(bad_rows)


def call_frame(name: Any, request_id: int = 1, *, args_first: bool = False) -> bytes:
    params = {"args": {}, "name": name} if args_first else {"name": name, "args": {}}
    return bytes(msgpack.packb([0, request_id, "call", params]))


@pytest.mark.parametrize("request_id", [1, 200, 70_000, 2**31])
def test_a_call_naming_a_huge_function_is_refused_from_its_first_bytes(request_id: int) -> None:
    for name in ("x" * 513, "x" * (15 << 20)):
        with pytest.raises(WireError, match="at most 128 characters"):
            schema.check_prefix(call_frame(name, request_id)[: schema.PREFIX_BYTES])
    # names that may be a function's pass; so does what the prefix cannot judge
    for name in ("f", "\u00e9" * 128, "x" * 512):
        schema.check_prefix(call_frame(name, request_id)[: schema.PREFIX_BYTES])
    schema.check_prefix(call_frame("x" * 1000, request_id, args_first=True)[:64])
    schema.check_prefix(call_frame(7, request_id)[:64])
    schema.check_prefix(bytes(msgpack.packb([2, "stream", {"name": "x" * 1000}]))[:64])
    schema.check_prefix(b"\x94\x00")
