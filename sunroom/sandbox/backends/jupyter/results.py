"""One cell's Jupyter messages turned into sunroom's execute result (``ExecutionResult``).

:class:`CellMessages` takes the IOPub messages whose parent is the cell's ``execute_request``
and then its ``execute_reply``, and returns the same dict a sunroom kernel sends for
``execute`` (checked by :func:`sunroom.rpc.schema.execute_result` like any other):

* ``stream`` → ``stdout`` / ``stderr``, capped as sunroom's kernels cap them: the first half of
  ``max_output_bytes`` and a tail of the second half are kept, the bytes between are dropped,
  counted in ``truncated_bytes`` and marked in the text; bytes an IPython kernel took out before
  sending (``sunroom_dropped``, :mod:`sunroom.prelude.streamcap`) count as dropped too;
* ``execute_result`` → ``value`` (its ``text/plain``); a bundle with more than plain text is
  also kept as a display item in ``outputs``, marked ``metadata["sunroom"]["execute_result"]
  = True`` as sunroom's kernels mark theirs;
* ``display_data`` and ``update_display_data`` → ``outputs`` (an update carries
  ``metadata["display_id"]`` and ``metadata["update"] = True``), within the cell's display
  caps (``max_display_bytes``, 100 items), the rest dropped and counted;
* ``error`` → ``error`` (``ename``, ``evalue``, the traceback with ANSI colour codes stripped).
  IPython's ``StdinNotImplementedError`` (``input()`` with no stdin) becomes ``EOFError``, as in
  sunroom's kernels;
* ``clear_output`` is not replayed: what was shown before it is kept.

Nothing a kernel sends can make this raise (docs/security.md: the host never raises on kernel
data). The messages come checked by :func:`.messages.parse` (a signed envelope
of JSON maps); their content is checked here, by the same rule for every type:

* a message that is not a message at all (:func:`~.messages.parse` gave None)
  or whose content does not fit its type (a ``stream`` whose ``name`` is not ``stdout`` or
  ``stderr`` or whose ``text`` is not a str, an ``execute_result`` whose ``data`` is not a
  map) is **ignored** and counted in :attr:`CellMessages.ignored`;
* a display (``execute_result`` with more than text, ``display_data``,
  ``update_display_data``) whose bundle cannot be used (no usable MIME type, a mime type over
  128 characters, a value of the wrong type) is **dropped** and counted in
  ``dropped_outputs``, as sunroom's kernels count theirs; ``metadata`` or ``transient`` that
  is not a map is taken as empty;
* an ``error`` is always an error: an ``ename`` or ``evalue`` that is not a str becomes
  ``"Error"`` or ``""``, a traceback that is not a list of str keeps only its str lines.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import deque
from collections.abc import Callable
from typing import Any, Final, final

from sunroom.rpc import schema
from sunroom.rpc.codec import WireError
from sunroom.rpc.schema import MAX_DISPLAY_ITEMS
from sunroom.sandbox.backends.jupyter.messages import Message

BINARY_MIMES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""MIME types whose Jupyter data is base64 text and whose sunroom data is bytes."""
MAX_VALUES: Final = 50_000
"""Values (strings, numbers, list and map entries) kept over one cell's display items: the
result travels in one frame on the way out of the service, as a sunroom kernel's does."""
_ANSI: Final = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

OutputCallback = Callable[[str, str], None]


def strip_ansi(text: str) -> str:
    """*text* without ANSI escape sequences (IPython colours its tracebacks)."""
    return _ANSI.sub("", text)


@final
class _Stream:
    """One output stream of a cell: a head, a bounded tail, and the bytes dropped between."""

    def __init__(self, name: str, cap: int) -> None:
        self.name = name
        self._head_cap = cap // 2
        self._tail_cap = cap - cap // 2
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.dropped = 0

    def write(self, text: str) -> str:
        """Keep *text*; return the part of it that went to the head (what may be streamed)."""
        data = text.encode("utf-8", "replace")
        room = self._head_cap - len(self._head)
        live = ""
        if room > 0:
            head = data[:room]
            self._head += head
            live = text if len(head) == len(data) else head.decode("utf-8", "ignore")
            data = data[room:]
        if not data:
            return live
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size > self._tail_cap:
            first = self._tail[0]
            excess = self._tail_size - self._tail_cap
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_size -= len(first)
                self.dropped += len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_size -= excess
                self.dropped += excess
        return live

    def skip(self, count: int) -> None:
        """Count *count* bytes the kernel took out (never sent); they are marked as dropped.

        The kernel takes bytes out only past the same head this stream keeps, so the marker
        between head and tail stands where they were.
        """
        self.dropped += count

    def text(self) -> str:
        text = bytes(self._head).decode("utf-8", "replace")
        if self.dropped:
            text += f"\n[... {self.dropped} bytes of {self.name} dropped ...]\n"
        return text + b"".join(self._tail).decode("utf-8", "replace")


def _size(value: Any) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    return len(repr(value))


def _count(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(1 + _count(v) for v in value.values())
    if isinstance(value, list | tuple):
        return 1 + sum(_count(v) for v in value)
    return 1


@final
class CellMessages:
    """Collects one cell's messages; :meth:`result` gives the execute result dict.

    *on_output* is called with ``(stream, text)`` as stream messages arrive, for the head of
    each stream only (half of ``max_output_bytes``, as sunroom's kernels stream): a flood
    costs the listener nothing past it.
    """

    def __init__(
        self,
        *,
        max_output_bytes: int,
        max_display_bytes: int,
        on_output: OutputCallback | None = None,
    ) -> None:
        self._out = _Stream("stdout", max_output_bytes)
        self._err = _Stream("stderr", max_output_bytes)
        self._display_cap = max_display_bytes
        self._display_used = 0
        self._values = 0
        self._on_output = on_output
        self.value: str | None = None
        self.error: dict[str, str] | None = None
        self.outputs: list[dict[str, Any]] = []
        self.dropped_outputs = 0
        self.ignored = 0
        """Messages ignored: not well-formed, or a content that does not fit its type."""

    def add(self, msg: Message) -> None:
        """Take one IOPub message of the cell (others' messages must not be passed).

        A content that does not fit its type is ignored and counted (module docstring).
        """
        kind, content = msg.msg_type, msg.content
        if kind == "stream":
            name, text = content.get("name"), content.get("text")
            if type(text) is not str or (name != "stdout" and name != "stderr"):
                self.ignored += 1
                return
            stream = self._out if name == "stdout" else self._err
            dropped = content.get("sunroom_dropped")  # taken out in the kernel (streamcap)
            if type(dropped) is int and dropped > 0:
                stream.skip(min(dropped, 1 << 62))
            live = stream.write(text)
            if live and self._on_output is not None:
                self._on_output(name, live)
        elif kind == "execute_result":
            data = content.get("data")
            if type(data) is not dict:
                self.ignored += 1
                return
            plain = data.get("text/plain")
            self.value = plain if type(plain) is str else None
            if any(mime != "text/plain" for mime in data):
                self._display(data, content.get("metadata"), None, main=True)
        elif kind in ("display_data", "update_display_data"):
            transient = content.get("transient")
            display_id = transient.get("display_id") if type(transient) is dict else None
            extra: dict[str, Any] = {}
            if type(display_id) is str:
                extra["display_id"] = display_id
            if kind == "update_display_data":
                extra["update"] = True
            self._display(content.get("data"), content.get("metadata"), extra)
        elif kind == "error":
            self.error = _error(content)

    def reply(self, content: dict[str, Any]) -> None:
        """Take the cell's ``execute_reply`` content (after its IOPub messages)."""
        status = content.get("status")
        if status == "error" and self.error is None:
            self.error = _error(content)
        elif status == "aborted" and self.error is None:
            self.error = {
                "type": "Aborted",
                "message": "the kernel aborted the cell (an earlier cell failed)",
                "traceback": "",
            }

    def result(self, duration_s: float) -> dict[str, Any]:
        """The execute result dict (the shape sunroom's kernels send)."""
        return {
            "stdout": self._out.text(),
            "stderr": self._err.text(),
            "value": self.value,
            "error": self.error,
            "duration_s": duration_s,
            "truncated_bytes": self._out.dropped + self._err.dropped,
            "outputs": self.outputs,
            "dropped_outputs": self.dropped_outputs,
        }

    def _display(
        self, data: Any, metadata: Any, extra: dict[str, Any] | None, *, main: bool = False
    ) -> None:
        bundle = _bundle(data)
        meta = dict(metadata) if type(metadata) is dict else {}
        if extra:
            meta.update(extra)
        if main:  # marked as sunroom's kernels mark a trailing value's item
            own = meta.get("sunroom")
            meta["sunroom"] = {**(own if type(own) is dict else {}), "execute_result": True}
        if bundle is None:
            self.dropped_outputs += 1
            return
        item = {"output_type": "display_data", "data": bundle, "metadata": meta}
        try:  # what the execute result's checker will hold it to (mime names, value types)
            schema.display_items([item], self._display_cap)
        except WireError:
            self.dropped_outputs += 1
            return
        size = sum(_size(v) for v in bundle.values()) + _size(meta)
        values = _count(bundle) + _count(meta)
        if (
            len(self.outputs) >= MAX_DISPLAY_ITEMS
            or self._display_used + size > self._display_cap
            or self._values + values > MAX_VALUES
        ):
            self.dropped_outputs += 1
            return
        self._display_used += size
        self._values += values
        self.outputs.append(item)


def _bundle(data: Any) -> dict[str, Any] | None:
    """A Jupyter MIME bundle as sunroom carries it (images as bytes), or None if unusable."""
    if not isinstance(data, dict):
        return None
    out: dict[str, Any] = {}
    for mime, datum in data.items():
        if not isinstance(mime, str):
            continue
        if mime in BINARY_MIMES:
            if not isinstance(datum, str):
                continue
            try:
                out[mime] = base64.b64decode(datum, validate=False)
            except (binascii.Error, ValueError):
                continue
        elif mime == "application/json" or mime.endswith("+json") or isinstance(datum, str):
            out[mime] = datum
        elif isinstance(datum, list) and all(isinstance(x, str) for x in datum):
            out[mime] = "".join(datum)  # nbformat's multi-line strings
    if "text/plain" not in out:
        if not out:
            return None
        out["text/plain"] = f"<{', '.join(sorted(out))}>"
    return out


def _error(content: dict[str, Any]) -> dict[str, str]:
    ename = content.get("ename")
    ename = ename if type(ename) is str and ename else "Error"
    evalue = content.get("evalue")
    evalue = evalue if type(evalue) is str else ""
    tb = content.get("traceback")
    lines = [line for line in tb if type(line) is str] if type(tb) is list else []
    traceback = strip_ansi("\n".join(lines))
    if ename == "StdinNotImplementedError":
        return {
            "type": "EOFError",
            "message": "input() has no stdin in a sunroom kernel",
            "traceback": traceback,
        }
    return {"type": ename, "message": evalue, "traceback": traceback}
