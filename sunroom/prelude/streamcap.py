"""Caps an IPython kernel's ``stream`` messages as they leave it, so a flood stays in the kernel.

ipykernel buffers what a cell writes (``print``, and fd 1/2 through its watcher threads) and
sends it as ``stream`` messages with no bound: a cell writing a gigabyte sends messages of tens
of megabytes, each decoded whole by the host's client. :class:`StreamCap` is an ipykernel
``OutStream`` hook (``register_hook``: each message passes through it before it is sent) that
applies sunroom's output contract per cell (the message's parent) and stream: the first half
of ``max_output_bytes`` passes whole; past it, each message keeps only its last half-cap, and
the bytes taken out are counted in the message's ``sunroom_dropped`` field (Jupyter clients
ignore unknown fields; sunroom's host adds them to ``truncated_bytes``). The host's own cap then
keeps the head and the tail as for sunroom's kernels, and no message is larger than about the
cap. Standard library only.
"""

from __future__ import annotations

from collections import OrderedDict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DROPPED_FIELD = "sunroom_dropped"
"""The content field counting the bytes a capped ``stream`` message had taken out."""
CELLS_KEPT = 16
"""Cells whose counts are remembered (a late message of an older cell starts a fresh count)."""


def utf8_len(text: str) -> int:
    """Bytes of *text* in UTF-8, without a copy for ASCII."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "replace"))


class StreamCap:
    """The hook: call it with a message; it returns the message, trimmed past the head."""

    def __init__(self, max_output_bytes: int) -> None:
        self.head = max(0, max_output_bytes // 2)
        self.tail = max(1, max_output_bytes - self.head)
        self._sent: OrderedDict[tuple[str, str], int] = OrderedDict()

    def __call__(self, msg: Any) -> Any:
        """Trim one outgoing message (a dict as ipykernel's Session builds it)."""
        try:
            kind = msg["header"]["msg_type"]
            content = msg["content"]
            parent = str(msg.get("parent_header", {}).get("msg_id", ""))
        except (KeyError, TypeError):
            return msg
        if kind != "stream" or not isinstance(content.get("text"), str):
            return msg
        key = (parent, str(content.get("name")))
        sent = self._sent.pop(key, 0)
        text = content["text"]
        size = utf8_len(text)
        room = self.head - sent
        if size > room:
            head = text[:room] if room > 0 else ""
            rest = text[len(head) :]
            kept = rest[-self.tail :]
            dropped = utf8_len(rest) - utf8_len(kept)
            if dropped:
                content["text"] = head + kept
                content[DROPPED_FIELD] = dropped
        self._sent[key] = sent + size
        while len(self._sent) > CELLS_KEPT * 2:
            self._sent.popitem(last=False)
        return msg


def install(streams: Any, max_output_bytes: int) -> StreamCap | None:
    """Register one cap on every ipykernel ``OutStream`` in *streams*; None if there is none.

    ipykernel keeps hooks per thread and sends from its IO thread, so the registration is
    scheduled there (``pub_thread.schedule``), and on the calling thread too (a stream flushed
    where its IO thread is gone, as in a forked child).
    """
    cap = StreamCap(max_output_bytes)
    hooked = False
    for stream in streams:
        register = getattr(stream, "register_hook", None)
        if register is None:
            continue
        register(cap)
        schedule = getattr(getattr(stream, "pub_thread", None), "schedule", None)
        if schedule is not None:
            schedule(lambda register=register: register(cap))
        hooked = True
    return cap if hooked else None
