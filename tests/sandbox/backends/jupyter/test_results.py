"""Jupyter messages → sunroom's execute result: caps, display bundles, errors (no kernel needed).

The messages are shaped as ipykernel 7 sends them; the end-to-end mapping runs against real
kernels in test_jupyter_backend.py.
"""

from __future__ import annotations

import base64
from typing import Any

from jupyter_client.session import Session

from sunroom.rpc import schema
from sunroom.rpc.shapes import ExecuteReply
from sunroom.sandbox.backends.jupyter.messages import Message, parse
from sunroom.sandbox.backends.jupyter.results import CellMessages, strip_ansi


def msg(kind: str, **content: Any) -> Message:
    return Message(msg_type=kind, parent_id="cell", content=content, metadata={})


def cell(max_output_bytes: int = 1000, max_display_bytes: int = 10_000) -> CellMessages:
    return CellMessages(max_output_bytes=max_output_bytes, max_display_bytes=max_display_bytes)


def checked(c: CellMessages, cap: int = 1000, display: int = 10_000) -> ExecuteReply:
    """The result, through the same checker as a sunroom kernel's answer."""
    return schema.execute_result(cap, display)(c.result(0.01))


def error_type(c: CellMessages) -> str:
    error = checked(c)["error"]
    assert error is not None
    return error["type"]


def test_streams_values_and_live_output() -> None:
    seen: list[tuple[str, str]] = []
    c = CellMessages(
        max_output_bytes=1000, max_display_bytes=1000, on_output=lambda n, t: seen.append((n, t))
    )
    c.add(msg("stream", name="stdout", text="a\n"))
    c.add(msg("stream", name="stderr", text="warn\n"))
    c.add(msg("stream", name="stdout", text="b\n"))
    c.add(msg("execute_result", data={"text/plain": "42"}, metadata={}, execution_count=1))
    c.reply({"status": "ok"})
    r = checked(c)
    assert r["stdout"] == "a\nb\n"
    assert r["stderr"] == "warn\n"
    assert r["value"] == "42"
    assert r["error"] is None
    assert r["outputs"] == []  # a plain value is the value, not a display item too
    assert seen == [("stdout", "a\n"), ("stderr", "warn\n"), ("stdout", "b\n")]


def test_a_flood_keeps_head_and_tail_and_counts_the_rest() -> None:
    c = cell(max_output_bytes=100)
    for i in range(1000):
        c.add(msg("stream", name="stdout", text=f"{i:04d}\n"))  # 5 bytes each, 5000 in all
    r = checked(c, cap=100)
    assert r["stdout"].startswith("0000\n0001\n")
    assert r["stdout"].endswith("0998\n0999\n")
    assert r["truncated_bytes"] == 5000 - 100
    assert "[... 4900 bytes of stdout dropped ...]" in r["stdout"]


def test_rich_values_and_displays_become_outputs_with_images_as_bytes() -> None:
    png = b"\x89PNG\r\n\x1a\nfake"
    c = cell()
    c.add(
        msg(
            "display_data",
            data={"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure>"},
            metadata={"image/png": {"width": 10}},
            transient={"display_id": "d1"},
        )
    )
    c.add(
        msg(
            "update_display_data",
            data={"text/plain": "2"},
            metadata={},
            transient={"display_id": "d1"},
        )
    )
    c.add(msg("execute_result", data={"text/plain": "df", "text/html": "<table/>"}, metadata={}))
    r = checked(c)
    first, update, value = r["outputs"]
    assert first["data"]["image/png"] == png
    assert first["metadata"] == {"image/png": {"width": 10}, "display_id": "d1"}
    assert update["metadata"] == {"display_id": "d1", "update": True}
    assert value["data"] == {"text/plain": "df", "text/html": "<table/>"}
    assert value["metadata"] == {"sunroom": {"execute_result": True}}
    assert r["value"] == "df"


def test_the_execute_results_item_is_marked_next_to_its_own_metadata() -> None:
    c = cell()
    meta = {"sunroom": {"errors": {"text/html": "E: x"}}, "text/html": {"isolated": True}}
    c.add(msg("execute_result", data={"text/plain": "v", "text/html": "<b/>"}, metadata=meta))
    c.add(
        msg(
            "execute_result", data={"text/plain": "w", "text/html": "<i/>"}, metadata={"sunroom": 1}
        )
    )
    first, second = checked(c)["outputs"]
    assert first["metadata"] == {
        "sunroom": {"errors": {"text/html": "E: x"}, "execute_result": True},
        "text/html": {"isolated": True},
    }
    assert second["metadata"] == {"sunroom": {"execute_result": True}}


def test_display_caps_drop_and_count() -> None:
    c = cell(max_display_bytes=1000)
    for _ in range(150):
        c.add(msg("display_data", data={"text/plain": "x" * 100}, metadata={}))
    r = checked(c, display=1000)
    assert len(r["outputs"]) == 9  # 1000 bytes of 102-byte items (metadata "{}" counts)
    assert r["dropped_outputs"] == 141
    many = cell(max_display_bytes=10**9)
    for _ in range(150):
        many.add(msg("display_data", data={"text/plain": "x"}, metadata={}))
    assert len(many.outputs) == 100
    assert many.dropped_outputs == 50


def test_errors_lose_their_colours_and_input_is_an_eof_error() -> None:
    c = cell()
    tb = ["\x1b[0;31mZeroDivisionError\x1b[0m  Traceback", "\x1b[1;32m----> 1\x1b[0m 1/0"]
    c.add(msg("error", ename="ZeroDivisionError", evalue="division by zero", traceback=tb))
    c.reply({"status": "error", "ename": "ZeroDivisionError", "evalue": "division by zero"})
    r = checked(c)
    assert r["error"] == {
        "type": "ZeroDivisionError",
        "message": "division by zero",
        "traceback": "ZeroDivisionError  Traceback\n----> 1 1/0",
    }
    stdin = cell()
    stdin.add(
        msg("error", ename="StdinNotImplementedError", evalue="raw_input was called", traceback=[])
    )
    assert error_type(stdin) == "EOFError"
    assert strip_ansi("\x1b[38;5;12mblue\x1b[0m") == "blue"


def test_a_reply_error_without_an_error_message_and_an_abort_are_errors() -> None:
    c = cell()
    c.reply({"status": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []})
    assert error_type(c) == "KeyboardInterrupt"
    aborted = cell()
    aborted.reply({"status": "aborted"})
    assert error_type(aborted) == "Aborted"


def test_malformed_bundles_are_dropped_not_fatal() -> None:
    c = cell()
    c.add(msg("display_data", data="not a bundle", metadata={}))
    c.add(msg("display_data", data={"image/png": 5}, metadata={}))  # no usable MIME type
    c.add(msg("display_data", data={"text/html": ["<b>", "x</b>"]}, metadata=None))
    r = checked(c)
    assert r["dropped_outputs"] == 2
    assert r["outputs"][0]["data"] == {"text/html": "<b>x</b>", "text/plain": "<text/html>"}


def test_parse_accepts_only_signed_envelopes_of_json_maps() -> None:
    session = Session(key=b"k" * 32)

    def frames(*parts: bytes, sign: bool = True) -> list[bytes]:
        return [b"topic", b"<IDS|MSG>", session.sign(list(parts)) if sign else b"x", *parts]

    header = b'{"msg_type": "stream", "msg_id": "m"}'
    parent = b'{"msg_id": "cell"}'
    content = b'{"name": "stdout", "text": "a\\ud800"}'
    good = parse(session, frames(header, parent, b"{}", content))
    assert good == Message("stream", "cell", {"name": "stdout", "text": "a\\ud800"}, {})
    assert good is not None and good.content["text"].encode("utf-8")  # escaped: valid UTF-8
    assert parse(session, frames(header, parent, b"{}", content, sign=False)) is None
    assert parse(session, frames(header, parent, b"{}")) is None  # too few parts
    assert parse(session, [header, parent, b"{}", content]) is None  # no delimiter
    for bad in (b"[1]", b'"x"', b"{", b'{"t": NaN}', b"[" * 5000):
        assert parse(session, frames(header, parent, b"{}", bad)) is None, bad
    assert parse(session, frames(b'{"msg_type": 5}', parent, b"{}", b"{}")) is None
    deep = b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}"
    assert parse(session, frames(header, parent, b"{}", deep)) is None
    latin = parse(session, frames(header, parent, b"{}", b'{"text": "caf\xe9"}'))
    assert latin is not None and latin.content == {"text": "caf\ufffd"}  # not UTF-8: replaced
    stale = parse(session, frames(header, b'{"msg_id": 7}', b"{}", b"{}"))
    assert stale is not None and stale.parent_id is None
