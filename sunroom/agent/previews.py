"""Short JSON previews of values for events: :func:`json_preview`.

A host call's arguments or a sub-call's input may be megabytes (``predict_many`` over every
chunk of a document); an event carries a preview of at most a few thousand characters. The
preview is written piece by piece and stops once it is long enough, so its cost is bounded by
the limit, not by the value. The caller redacts the text before cutting it
(:func:`sunroom.agent.events.preview`): a secret cut in half would not be recognised.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

from sunroom.agent.events import PREVIEW_CHARS

__all__ = ["json_preview"]

_MAX_DEPTH = 32


def json_preview(value: object, limit: int = PREVIEW_CHARS) -> str:
    """*value* as JSON text, at most about *limit* characters plus one piece (uncut).

    Strings, numbers, booleans, None, lists, tuples and mappings are JSON; bytes are
    ``"<N bytes>"``; any other object is its type's name in angle brackets (never its
    ``repr``, which may be large or run code). Longer strings inside are cut first, so the
    structure stays readable. Cut the result with :func:`sunroom.agent.events.preview` after
    redacting it.
    """
    out: list[str] = []
    size = 0
    for piece in _pieces(value, 0, limit):
        out.append(piece)
        size += len(piece)
        if size > limit:
            break
    return "".join(out)


def _pieces(value: object, depth: int, limit: int) -> Iterator[str]:
    if value is None or isinstance(value, bool | int | float):
        yield json.dumps(value)
    elif isinstance(value, str):
        yield json.dumps(value if len(value) <= limit else value[:limit] + "…", ensure_ascii=False)
    elif isinstance(value, bytes | bytearray | memoryview):
        yield f'"<{len(value)} bytes>"'
    elif depth >= _MAX_DEPTH:
        yield '"…"'
    elif isinstance(value, Mapping):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield (", " if i else "") + json.dumps(str(key), ensure_ascii=False) + ": "
            yield from _pieces(item, depth + 1, limit)
        yield "}"
    elif isinstance(value, list | tuple):
        yield "["
        for i, item in enumerate(value):
            if i:
                yield ", "
            yield from _pieces(item, depth + 1, limit)
        yield "]"
    else:
        yield json.dumps(f"<{type(value).__name__}>")
