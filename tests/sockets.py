"""Where a socket that was never closed came from: the test that made it and its stack.

Python warns of a socket collected while open (``ResourceWarning: unclosed <socket...>``), and
the suite turns warnings into errors. The warning fires wherever the collector happens to run,
often in a later test that has nothing to do with it, and names only the socket's addresses.
:func:`install` records, for each :class:`socket.socket` made in the test process, the test
that was running and the frames that made it; when such a socket is collected without having
been closed, that record goes to standard error, which pytest shows with the failing test.

The record is a few frames per socket, dropped when the socket is closed or collected.
"""

from __future__ import annotations

import os
import socket
import sys
import weakref
from collections.abc import Callable
from typing import IO, Any

_FRAMES = 14
_SKIPPED = ("/_pytest/", "/pluggy/")
"""Frames of pytest's own machinery, left out of a record."""

current_test: str | None = None
"""The node id of the test running in this process (set by the conftest), or None."""

_unclosed: dict[int, tuple[weakref.ref[socket.socket], str, list[str]]] = {}
"""Each socket made and not yet closed, by ``id``: a weak reference, its test, its frames."""
_installed = False


def _stack() -> list[str]:
    frames: list[str] = []
    frame = sys._getframe(2)
    while frame is not None and len(frames) < _FRAMES:
        code = frame.f_code
        if not any(part in code.co_filename for part in _SKIPPED):
            frames.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back  # type: ignore[assignment]
    return frames


def _collected(key: int) -> None:
    entry = _unclosed.pop(key, None)
    if entry is None:
        return
    _, test, frames = entry
    lines = "\n".join(f"    {f}" for f in frames)
    text = (
        f"tests/sockets.py: a socket made during {test or 'no test'} was collected unclosed"
        f" (during {current_test or 'no test'}); it was made at:\n{lines}\n"
    )
    if sys.stderr is not None:  # None only while the interpreter exits
        sys.stderr.write(text)
    _log(text)


def _log(text: str, _open: Callable[..., IO[str]] = open) -> None:
    # open bound at definition: a socket collected while the interpreter exits has no builtins
    path = os.environ.get("SUNROOM_SOCKET_LOG")
    if path:
        with _open(path, "a") as f:
            f.write(f"[pid {os.getpid()}] {text}")


def report_open() -> None:
    """Log (to ``SUNROOM_SOCKET_LOG``, if set) every socket still open: at the session's end."""
    for ref, test, frames in list(_unclosed.values()):
        sock = ref()
        if sock is None:
            continue
        lines = "\n".join(f"    {f}" for f in frames)
        _log(f"still open at the end: {sock!r}, made during {test or 'no test'} at:\n{lines}\n")


def install() -> None:
    """Start recording sockets' origins in this process (once; later calls do nothing)."""
    global _installed
    if _installed:
        return
    _installed = True
    init = socket.socket.__init__
    real_close = socket.socket._real_close  # type: ignore[attr-defined]
    detach = socket.socket.detach

    def tracked_init(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        key = id(self)
        _unclosed[key] = (
            weakref.ref(self, lambda _ref: _collected(key)),
            current_test or "",
            _stack(),
        )

    def tracked_close(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        _unclosed.pop(id(self), None)
        real_close(self, *args, **kwargs)

    def tracked_detach(self: socket.socket) -> int:
        _unclosed.pop(id(self), None)
        return detach(self)

    socket.socket.__init__ = tracked_init  # type: ignore[method-assign]
    socket.socket._real_close = tracked_close  # type: ignore[attr-defined]
    socket.socket.detach = tracked_detach  # type: ignore[method-assign,assignment]
