"""Source text of cells and generated code, for tracebacks.

``linecache`` pulls in ``tokenize`` and ``re`` (~7 ms of kernel start), so sources are kept here
and handed to ``linecache`` only once something has imported it (a traceback being formatted,
or the user's own code). Registering a cell is O(1); publishing catches up only on what was not
published yet.
"""

from __future__ import annotations

import sys

_sources: dict[str, str] = {}
_unpublished: list[str] = []


def _register(linecache: object, filename: str) -> None:
    source = _sources[filename]
    cache: dict[str, object] = linecache.cache  # type: ignore[attr-defined]
    cache[filename] = (len(source), None, source.splitlines(True), filename)


def remember(filename: str, source: str) -> None:
    """Keep *source* for *filename*; give it to linecache at once if linecache is loaded."""
    _sources[filename] = source
    linecache = sys.modules.get("linecache")
    if linecache is None:
        _unpublished.append(filename)
    else:
        if _unpublished:
            publish()
        _register(linecache, filename)


def publish() -> None:
    """Give every source not yet published to linecache (imports it)."""
    import linecache

    while _unpublished:
        _register(linecache, _unpublished.pop())
