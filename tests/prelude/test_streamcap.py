"""The kernel-side cap on an IPython kernel's stream messages (sunroom.prelude.streamcap)."""

from __future__ import annotations

from typing import Any

from sunroom.prelude.streamcap import CELLS_KEPT, DROPPED_FIELD, StreamCap, install, utf8_len


def stream(text: str, parent: str = "cell-1", name: str = "stdout") -> dict[str, Any]:
    return {
        "header": {"msg_type": "stream"},
        "parent_header": {"msg_id": parent},
        "content": {"name": name, "text": text},
    }


def test_the_head_passes_whole_then_each_message_keeps_its_last_half_cap() -> None:
    cap = StreamCap(100)  # head 50, tail 50
    first = cap(stream("a" * 30))["content"]
    assert first == {"name": "stdout", "text": "a" * 30}
    crossing = cap(stream("b" * 20 + "c" * 200))["content"]  # 20 fill the head, 200 past it
    assert crossing["text"] == "b" * 20 + "c" * 50
    assert crossing[DROPPED_FIELD] == 150
    later = cap(stream("d" * 1000))["content"]
    assert later["text"] == "d" * 50 and later[DROPPED_FIELD] == 950
    small = cap(stream("e" * 10))["content"]  # within the tail: untouched
    assert small == {"name": "stdout", "text": "e" * 10}


def test_cells_and_streams_are_counted_apart_and_old_cells_forgotten() -> None:
    cap = StreamCap(100)
    cap(stream("x" * 50, parent="one"))
    assert DROPPED_FIELD not in cap(stream("y" * 50, parent="two"))["content"]
    assert DROPPED_FIELD not in cap(stream("z" * 50, parent="one", name="stderr"))["content"]
    assert cap(stream("w" * 60, parent="one"))["content"][DROPPED_FIELD] == 10
    for i in range(CELLS_KEPT * 3):
        cap(stream("q", parent=f"cell-{i}"))
    assert len(cap._sent) <= CELLS_KEPT * 2


def test_other_messages_and_malformed_ones_pass_untouched() -> None:
    cap = StreamCap(10)
    status = {"header": {"msg_type": "status"}, "content": {"execution_state": "busy"}}
    assert cap(status) is status
    assert cap({"nonsense": 1}) == {"nonsense": 1}
    odd = stream("x" * 100)
    odd["content"]["text"] = 5
    assert cap(odd)["content"]["text"] == 5


def test_sizes_are_utf8_bytes_and_install_needs_hookable_streams() -> None:
    assert utf8_len("é☀") == 5 and utf8_len("abc") == 3
    assert install([object()], 100) is None

    class Hookable:
        def __init__(self) -> None:
            self.hooks: list[Any] = []

        def register_hook(self, hook: Any) -> None:
            self.hooks.append(hook)

    s = Hookable()
    cap = install([s], 100)
    assert cap is not None and s.hooks == [cap]
