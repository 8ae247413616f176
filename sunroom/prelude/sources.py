"""Source text of cells and generated code, for tracebacks.

``linecache`` pulls in ``tokenize`` and ``re`` (~7 ms of kernel start), so sources are kept here
and handed to ``linecache`` only once something has imported it (a traceback being formatted,
or the user's own code).
"""

from __future__ import annotations

import sys

_sources: dict[str, str] = {}
_published: set[str] = set()


def remember(filename: str, source: str) -> None:
    """Keep *source* for *filename*; publish it at once if linecache is already loaded."""
    _sources[filename] = source
    if "linecache" in sys.modules:
        publish()


def publish() -> None:
    """Give every remembered source to linecache (imports it)."""
    import linecache

    for filename, source in _sources.items():
        if filename not in _published or filename not in linecache.cache:
            lines = source.splitlines(True)
            linecache.cache[filename] = (len(source), None, lines, filename)
            _published.add(filename)
