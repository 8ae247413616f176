r"""What the host accepts from a Jupyter kernel: the envelope of every message, checked.

The kernel's own code holds the connection key (ipykernel keeps it in the kernel's memory), so
it can publish anything on IOPub and answer anything on the shell channel. jupyter-client's
``Session.deserialize`` trusts the shapes it is given (``msg["parent_header"].get(...)`` on a
str raises ``AttributeError``, a header without ``msg_type`` ``KeyError``), so the host does
not use it on a kernel's messages: :func:`receive` reads the raw frames and :func:`parse`
checks them, as the native channel checks its frames (:mod:`sunroom.rpc.schema`).

A message is accepted when it is ``[identities..., b"<IDS|MSG>", signature, header, parent
header, metadata, content, buffers...]`` with a valid HMAC signature (when the session has a
key), each of the four JSON parts JSON without ``NaN`` or ``Infinity``, a map, at most
:data:`MAX_DEPTH` levels deep, and the header's ``msg_type`` a str. Bytes that are not UTF-8
(jupyter-client's packer writes a ``surrogateescape``'d str as such) become U+FFFD, as in the
output of sunroom's own kernels. Anything else is
not a message: :func:`parse` returns None, the caller ignores it and counts it (the rule of
:class:`.results.CellMessages`). The *content* of a message of a known type is
checked where it is used (:mod:`.results`).

Lone surrogates: JSON may spell one (``"\ud800"``), which Python decodes to a str that UTF-8
cannot encode; every such character is replaced by its backslash escape (``\\ud800``), as
sunroom's own kernels send it (docs/protocol.md, "Frames"). The host never holds text it
cannot write out as UTF-8.
"""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, Final

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from sunroom.rpc.codec import escape_surrogates

__all__ = ["MAX_DEPTH", "Message", "parse", "receive"]

DELIM: Final = b"<IDS|MSG>"
MAX_DEPTH: Final = 32
"""Deepest JSON nesting accepted in a part (the display checker's limit, rpc.schema)."""
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape that may spell half of a surrogate pair (U+D800 to U+DFFF)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One well-formed Jupyter message; its content is a map whose values are unchecked."""

    msg_type: str
    parent_id: str | None
    """The parent header's ``msg_id``, when it is a str (else None: nobody's reply)."""
    content: dict[str, Any]
    metadata: dict[str, Any]


def parse(session: Session, frames: list[bytes]) -> Message | None:
    """The message in *frames* (as ``recv_multipart`` gives them), or None if it is not one.

    Never raises for what the frames hold (see the module docstring for what is accepted).
    """
    try:
        at = frames.index(DELIM)
    except ValueError:
        return None
    parts = frames[at + 1 :]
    if len(parts) < 5 or not all(type(part) is bytes for part in parts[:5]):
        return None
    signature, raw = parts[0], parts[1:5]
    if session.auth is not None and not hmac.compare_digest(signature, session.sign(raw)):
        return None
    decoded: list[dict[str, Any]] = []
    for part in raw:
        value = _json_map(part)
        if value is None:
            return None
        decoded.append(value)
    header, parent, metadata, content = decoded
    msg_type = header.get("msg_type")
    if type(msg_type) is not str:
        return None
    parent_id = parent.get("msg_id")
    return Message(
        msg_type=msg_type,
        parent_id=parent_id if type(parent_id) is str else None,
        content=content,
        metadata=metadata,
    )


async def receive(
    socket: zmq.asyncio.Socket, session: Session, wait_s: float | None
) -> Message | None:
    """The next message on *socket*: a :class:`Message`, None for frames that are not one.

    Waits at most *wait_s* seconds (None: without limit); raises TimeoutError past it.
    """
    if wait_s is not None and not await socket.poll(max(0, int(wait_s * 1000))):
        raise TimeoutError("no Jupyter message arrived in time")
    frames: list[bytes] = await socket.recv_multipart()
    return parse(session, frames)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_map(part: bytes) -> dict[str, Any] | None:
    """*part* as a JSON map within :data:`MAX_DEPTH` levels, or None."""
    try:
        value = json.loads(part.decode("utf-8", "replace"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # JSONDecodeError included
        return None
    if type(value) is not dict or _too_deep(value):
        return None
    checked: dict[str, Any] = value
    if _SURROGATE_ESCAPE.search(part):
        escaped = escape_surrogates(checked)
        if isinstance(escaped, dict):  # a map comes back a map
            checked = escaped
    return checked


def _too_deep(value: Any) -> bool:
    """Whether *value* nests containers more than :data:`MAX_DEPTH` levels (iteratively)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        if type(item) is dict:
            stack.extend((v, depth + 1) for v in item.values() if type(v) in (dict, list))
        elif type(item) is list:
            stack.extend((v, depth + 1) for v in item if type(v) in (dict, list))
    return False
