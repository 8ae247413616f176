"""What the host accepts from a kernel: the schema of every message a kernel may send.

The host's channel checks each message from a kernel against these shapes before any of it is
used; a message that does not fit raises :class:`~sunroom.rpc.codec.WireError`, which the
channel turns into :class:`~sunroom.errors.ProtocolError` (it closes; the kernel is killed and
restarted). A checker returns the message's content rebuilt from the keys it knows, with
exactly the types listed; keys it does not know are dropped (a newer kernel may add optional
keys). Error messages never quote kernel-supplied text beyond a few dozen characters.

Kernel → host:

* notification ``hello``: ``{"protocol": int, "pid": int, "python": str, "nonce": str}`` (the
  values are checked by the launcher; here their types, where present);
* notification ``stream``: ``{"name": "stdout" | "stderr", "text": str}``;
* notification ``forked``: ``{"pid": int >= 1}`` (a single copy, while the kernel forks);
* request ``call``: ``{"name": str (1-128 chars), "args": {str: any}}``;
* the result of ``execute``, ``install``, ``bind`` and ``variables`` (see the checkers below).

object other notification is a violation; a request for any other method is answered with a
``MethodNotFound`` error by the channel's handler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from sunroom.rpc.codec import WireError
from sunroom.rpc.shapes import (
    CallParams,
    CellErrorReply,
    DisplayData,
    DisplayItemReply,
    ExecuteReply,
    ForkedParams,
    HelloParams,
    Json,
    PackageListingReply,
    PackageRow,
    StreamParams,
    VariableRow,
)

T_co = TypeVar("T_co", covariant=True)

Check = Callable[[object], T_co]
"""Checks one kernel-supplied value and returns it rebuilt as a ``T_co``; raises WireError."""

Checker = Callable[[object], object]
"""A check whose result is not typed (kept for the callers that predate :data:`Check`)."""

MAX_NAME: Final = 128
"""Longest host function name a ``call`` may carry (the same cap as a method name)."""

OUTPUT_MARKER_SLACK: Final = 1024
"""Characters allowed in one output stream beyond ``max_output_bytes`` (the drop marker)."""


def _kind(value: object) -> str:
    return type(value).__name__


def _map(value: object, what: str) -> dict[object, object]:
    if type(value) is not dict:
        raise WireError(f"{what} must be a map, got {_kind(value)}")
    return value


def _str(value: object, what: str, *, longest: int | None = None) -> str:
    if type(value) is not str:
        raise WireError(f"{what} must be a str, got {_kind(value)}")
    if longest is not None and len(value) > longest:
        raise WireError(f"{what} must be at most {longest} characters, got {len(value)}")
    return value


def _int(value: object, what: str, *, least: int | None = None) -> int:
    if type(value) is not int:
        raise WireError(f"{what} must be an int, got {_kind(value)}")
    if least is not None and value < least:
        raise WireError(f"{what} must be at least {least}, got {value}")
    return value


def _number(value: object, what: str) -> float:
    if type(value) is not float and type(value) is not int:
        raise WireError(f"{what} must be a number, got {_kind(value)}")
    return float(value)


def _optional_str(value: object, what: str) -> str | None:
    return None if value is None else _str(value, what)


# -- notifications -------------------------------------------------------------------------------


def hello(raw: object) -> HelloParams:
    """The kernel's first message; the launcher checks the values (nonce, version, pid)."""
    params = _map(raw, "hello")
    out: HelloParams = {}
    if "protocol" in params:
        out["protocol"] = _int(params["protocol"], "hello.protocol")
    if "pid" in params:
        out["pid"] = _int(params["pid"], "hello.pid", least=1)
    if "python" in params:
        out["python"] = _str(params["python"], "hello.python", longest=64)
    if "nonce" in params:
        out["nonce"] = _str(params["nonce"], "hello.nonce", longest=256)
    return out


def stream(raw: object) -> StreamParams:
    """Output a cell wrote: ``{"name": "stdout" | "stderr", "text": str}``."""
    params = _map(raw, "stream")
    name = params.get("name")
    if name != "stdout" and name != "stderr":
        raise WireError('stream.name must be "stdout" or "stderr"')
    return {"name": name, "text": _str(params.get("text"), "stream.text")}


def forked(raw: object) -> ForkedParams:
    """A copy forked while the kernel serves ``fork``: ``{"pid": int >= 1}`` (the kernel's view)."""
    params = _map(raw, "forked")
    return {"pid": _int(params.get("pid"), "forked.pid", least=1)}


NOTIFICATIONS: Final[Mapping[str, Check[object]]] = {
    "hello": hello,
    "stream": stream,
    "forked": forked,
}
"""Every notification a kernel may send, by method."""


# -- requests --------------------------------------------------------------------------------


def call(raw: object) -> CallParams:
    """A host function call: ``{"name": str (1-128 chars), "args": {str: any}}``."""
    params = _map(raw, "call params")
    name = _str(params.get("name"), "call.name", longest=MAX_NAME)
    if not name:
        raise WireError("call.name must not be empty")
    args: dict[str, object] = {}
    for key, value in _map(params.get("args"), "call.args").items():
        if type(key) is not str:
            raise WireError(f"call.args keys must be str, got {_kind(key)}")
        args[key] = value
    return {"name": name, "args": args}


REQUESTS: Final[Mapping[str, Check[object]]] = {"call": call}
"""Requests a kernel may send whose params are checked here (others: MethodNotFound)."""

PREFIX_BYTES: Final = 64
"""Bytes of a frame :func:`check_prefix` needs (fewer when the frame is shorter)."""


def check_prefix(prefix: bytes) -> None:
    """Refuse, from a frame's first bytes, a ``call`` whose name cannot be a function's.

    The host runs this on the start of a large frame, so that a call naming a 15 MiB function
    is refused before the rest of it arrives or is decoded. It judges only the msgpack a kernel
    writes, ``[0, id, "call", {"name": ..., ...}]``, and only the name's length in bytes (more
    than 4 bytes per character cannot be UTF-8); anything else passes, for :func:`call` to
    check once decoded. Raises WireError.
    """
    b = prefix[:PREFIX_BYTES]
    if len(b) < 8 or b[0] != 0x94 or b[1] != 0x00:
        return
    id_sizes = {0xCC: 2, 0xCD: 3, 0xCE: 5}
    at = 3 if b[2] <= 0x7F else 2 + id_sizes.get(b[2], len(b))
    if b[at : at + 5] != b"\xa4call" or at + 5 >= len(b):
        return
    at += 5
    if 0x81 <= b[at] <= 0x8F:
        at += 1
    elif b[at] == 0xDE:
        at += 3
    else:
        return
    if b[at : at + 5] != b"\xa4name" or at + 5 >= len(b):
        return
    at += 5
    lead, size_bytes = b[at], {0xD9: 1, 0xDA: 2, 0xDB: 4}.get(b[at], 0)
    if 0xA0 <= lead <= 0xBF or at + 1 + size_bytes > len(b) or not size_bytes:
        return  # a fixstr is short enough; another type is for call() to refuse
    length = int.from_bytes(b[at + 1 : at + 1 + size_bytes], "big")
    if length > 4 * MAX_NAME:
        raise WireError(f"call.name must be at most {MAX_NAME} characters, got {length} bytes")


# -- results of the host's requests ------------------------------------------------------------


MAX_DISPLAY_ITEMS: Final = 100
"""Display items one execute result may carry (the kernel keeps at most this many)."""

_BINARY_MIMES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def _json_value(value: object, what: str, depth: int = 0) -> Json:
    """Plain JSON data (None, bool, int, float, str, lists, str-keyed maps), at most 32 deep."""
    if depth > 32:
        raise WireError(f"{what} is nested too deeply")
    if value is None or type(value) is bool or type(value) is int:
        return value
    if type(value) is float or type(value) is str:
        return value
    if type(value) is list:
        return [_json_value(v, what, depth + 1) for v in value]
    if type(value) is dict:
        out: dict[str, Json] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise WireError(f"{what} has a key that is not a str")
            out[key] = _json_value(item, what, depth + 1)
        return out
    raise WireError(f"{what} holds a {_kind(value)}, which is not JSON")


def _display_datum(mime: str, datum: object) -> tuple[DisplayData, int]:
    """One mime type's value checked for its type, and its size toward the display cap."""
    if mime in _BINARY_MIMES:
        if type(datum) is not bytes:
            raise WireError(f"display data {mime} must be bytes, got {_kind(datum)}")
        return datum, len(datum)
    if mime == "application/json" or mime.endswith("+json"):
        value = _json_value(datum, f"display data {mime}")
        return value, len(repr(value))
    text = _str(datum, f"display data {mime}")
    return text, len(text)


def display_items(value: object, max_display_bytes: int) -> list[DisplayItemReply]:
    """The ``outputs`` of an execute result: display items within the cell's byte cap.

    ``[{"output_type": "display_data", "data": {mime: str | bytes | json}, "metadata": {...}}]``;
    image mime types carry bytes, other text types a str, ``application/json`` (and ``+json``)
    plain JSON. The lengths of all values together stay within *max_display_bytes* plus slack.
    """
    if type(value) is not list:
        raise WireError(f"execute.outputs must be a list, got {_kind(value)}")
    if not value:  # most cells show nothing
        return []
    if len(value) > MAX_DISPLAY_ITEMS:
        raise WireError(f"execute.outputs holds {len(value)} items, over {MAX_DISPLAY_ITEMS}")
    used = 0
    items: list[DisplayItemReply] = []
    for raw in value:
        item = _map(raw, "a display item")
        if item.get("output_type") != "display_data":
            raise WireError("a display item's output_type must be 'display_data'")
        data = _map(item.get("data"), "a display item's data")
        checked: dict[str, DisplayData] = {}
        for key, datum in data.items():
            mime = _str(key, "a mime type", longest=MAX_NAME)
            checked[mime], size = _display_datum(mime, datum)
            used += size
        if "text/plain" not in checked:
            raise WireError("a display item must carry text/plain")
        metadata = _json_value(item.get("metadata", {}), "a display item's metadata")
        if type(metadata) is not dict:
            raise WireError("a display item's metadata must be a map")
        used += len(repr(metadata))
        if used > max_display_bytes + OUTPUT_MARKER_SLACK * (len(items) + 1):
            raise WireError(f"execute.outputs hold more than {max_display_bytes} bytes")
        items.append({"output_type": "display_data", "data": checked, "metadata": metadata})
    return items


def execute_result(max_output_bytes: int, max_display_bytes: int = 8 << 20) -> Check[ExecuteReply]:
    """The checker of an ``execute`` result for a cell run with *max_output_bytes*.

    ``{"stdout": str, "stderr": str, "value": str | None, "error": None | {"type": str,
    "message": str, "traceback": str}, "duration_s": number >= 0, "truncated_bytes": int >= 0,
    "outputs": [display item], "dropped_outputs": int >= 0}``; each output stream holds at most
    ``max_output_bytes`` characters plus the drop marker, the display items at most
    ``max_display_bytes`` (:func:`display_items`).
    """
    longest = max_output_bytes + OUTPUT_MARKER_SLACK

    def check(raw: object) -> ExecuteReply:
        result = _map(raw, "the execute result")
        duration = _number(result.get("duration_s"), "execute.duration_s")
        if not duration >= 0:  # NaN included
            raise WireError("execute.duration_s must be a non-negative number")
        return {
            "stdout": _str(result.get("stdout"), "execute.stdout", longest=longest),
            "stderr": _str(result.get("stderr"), "execute.stderr", longest=longest),
            "value": _optional_str(result.get("value"), "execute.value"),
            "error": _cell_error(result.get("error")),
            "duration_s": duration,
            "truncated_bytes": _int(
                result.get("truncated_bytes"), "execute.truncated_bytes", least=0
            ),
            "outputs": display_items(result.get("outputs", []), max_display_bytes),
            "dropped_outputs": _int(
                result.get("dropped_outputs", 0), "execute.dropped_outputs", least=0
            ),
        }

    return check


def _cell_error(raw: object) -> CellErrorReply | None:
    """An execute result's ``error``: None, or ``{"type", "message", "traceback"}`` strs."""
    if raw is None:
        return None
    error = _map(raw, "execute.error")
    return {
        "type": _str(error.get("type"), "execute.error.type"),
        "message": _str(error.get("message"), "execute.error.message"),
        "traceback": _str(error.get("traceback"), "execute.error.traceback"),
    }


def names(result: object) -> list[str]:
    """The result of ``install`` and ``bind``: the names bound, ``[str]``."""
    if type(result) is not list:
        raise WireError(f"the result must be a list of names, got {_kind(result)}")
    return [_str(name, "a bound name") for name in result]


def pids(result: object) -> list[int]:
    """The result of ``fork``: the copies' supervisors' pids, ``[int]``."""
    if type(result) is not list:
        raise WireError(f"the fork result must be a list of pids, got {_kind(result)}")
    return [_int(pid, "a copy's pid", least=1) for pid in result]


def variables(result: object) -> list[VariableRow]:
    """The result of ``variables``: ``[{"name": str, "type": str, "repr": str}]``."""
    if type(result) is not list:
        raise WireError(f"the variables result must be a list, got {_kind(result)}")
    rows: list[VariableRow] = []
    for raw in result:
        row = _map(raw, "a variables row")
        rows.append(
            {
                "name": _str(row.get("name"), "variables.name"),
                "type": _str(row.get("type"), "variables.type"),
                "repr": _str(row.get("repr"), "variables.repr"),
            }
        )
    return rows


def packages(result: object) -> list[PackageRow]:
    """``install_packages`` rows: ``[{"name": str, "version": str, "site"?: bool}]``."""
    if type(result) is not list:
        raise WireError(f"the packages result must be a list, got {_kind(result)}")
    rows: list[PackageRow] = []
    for raw in result:
        row = _map(raw, "a packages row")
        rows.append(
            {
                "name": _str(row.get("name"), "packages.name", longest=200),
                "version": _str(row.get("version"), "packages.version", longest=200),
                "site": row.get("site", True) is True,
            }
        )
    return rows


def package_listing(raw: object) -> PackageListingReply:
    """The result of ``list_packages``: ``{"packages": rows, "sources": [str]}``."""
    result = _map(raw, "the list_packages result")
    sources = result.get("sources")
    if type(sources) is not list:
        raise WireError(f"list_packages.sources must be a list, got {_kind(sources)}")
    return {
        "packages": packages(result.get("packages")),
        "sources": [_str(s, "list_packages.sources", longest=40) for s in sources],
    }
