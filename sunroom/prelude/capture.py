"""Output capture at the file-descriptor level, capped at the source.

fd 1 and fd 2 are replaced by pipes, so ``print``, C extensions writing to ``stdout`` and child
processes are all captured. One reader thread polls both pipes (a bare ``_thread``: none of
``threading``'s bookkeeping, and its start does not wait for the thread to run, which a fork's
copy pays on its way to its first answer; one thread, not one a pipe, for the same reason and
one stack less in every idle kernel) and streams what a cell writes to the host as
``stream`` notifications, up to the head cap; beyond it only a bounded tail is kept and the
dropped byte count is reported. Invalid UTF-8 is replaced, never fatal. Nothing read here is
ever parsed as protocol.
"""

from __future__ import annotations

import _thread
import codecs
import contextlib
import fcntl
import io
import os
import select
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Callable

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    from typing import Final

F_SETPIPE_SZ: Final = 1031
READ_SIZE: Final = 1 << 20
BETWEEN_CELLS_CAP: Final = 64 * 1024
"""Bytes written outside any cell (background threads, daemons) streamed per quiet period."""


_NONE_PENDING: Final = bytes(4)


def pending(fd: int, count: bytearray) -> bool:
    """Whether the pipe *fd* holds unread bytes (FIONREAD into *count*, 4 bytes)."""
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count != _NONE_PENDING


class StreamCapture:
    """Capture one fd (1 or 2) through a pipe; see the module docstring."""

    def __init__(self, target_fd: int, name: str, send: Callable[[str, str], None]) -> None:
        self.name = name
        self._send = send
        rfd, wfd = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(wfd, F_SETPIPE_SZ, READ_SIZE)
        os.dup2(wfd, target_fd)
        os.close(wfd)
        self._rfd = rfd
        self._lock = threading.Lock()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._active = False
        self._head: list[bytes] = []
        self._head_left = 0
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._tail_cap = 0
        self._dropped = 0
        self._idle_sent = 0
        self._count = bytearray(4)  # FIONREAD's answer (under the lock)
        self._target_fd = target_fd

    @property
    def fd(self) -> int:
        """The pipe's read end (-1 once let go)."""
        return self._rfd

    @property
    def lock(self) -> threading.Lock:
        """The lock the reader thread holds while it handles output (held across a fork)."""
        return self._lock

    def let_go(self) -> int:
        """In a forked child: give up the read end (the reader is gone); the caller closes it.

        Returns it, or -1 once let go.
        """
        rfd, self._rfd = self._rfd, -1
        return rfd

    def after_fork(self) -> None:
        """In a kernel's copy: a new pipe (the parent's let go first); :class:`Reader` reads it.

        The fork held :attr:`lock` across it (released here: the reader it guarded against
        is not in the copy) while the capture was idle between cells, so its state is a
        fresh one's; the decoder is reset all the same.
        """
        if self._rfd >= 0:
            raise RuntimeError("a copy's capture makes its pipe once it let go of the parent's")
        rfd, wfd = os.pipe()
        with contextlib.suppress(OSError):
            fcntl.fcntl(wfd, F_SETPIPE_SZ, READ_SIZE)
        os.dup2(wfd, self._target_fd)
        os.close(wfd)
        self._rfd = rfd
        if self._lock.locked():
            self._lock.release()
        self._decoder.reset()
        self._active = False
        self._head, self._head_left = [], 0
        self._tail.clear()
        self._tail_size = 0
        self._dropped = self._idle_sent = 0

    def begin(self, cap: int) -> None:
        """Start a cell: stream up to ``cap // 2`` bytes, keep a ``cap // 2`` tail."""
        with self._lock:
            self._active = True
            if self._head or self._tail:  # (end() leaves both empty)
                self._head, self._tail, self._tail_size = [], deque(), 0
            self._head_left, self._tail_cap = cap - cap // 2, cap // 2
            self._dropped = 0

    def end(self) -> tuple[str, int]:
        """Finish a cell: drain what was written, return (text, dropped bytes).

        Waits up to 0.5 s for the reader to take what is still in the pipe. Starts a new quiet
        period for output written between cells.
        """
        deadline = 0.0
        while True:
            with self._lock:
                if not pending(self._rfd, self._count) or (
                    deadline and time.monotonic() > deadline
                ):
                    self._active = False
                    self._idle_sent = 0
                    head, tail, dropped = self._head, self._tail, self._dropped
                    if head or tail:
                        self._head, self._tail, self._tail_size = [], deque(), 0
                        self._decoder.reset()
                    break
            if not deadline:
                deadline = time.monotonic() + 0.5
            time.sleep(0.0002)
        if not head and not tail and not dropped:  # a cell that wrote nothing: most of them
            return "", 0
        text = b"".join(head).decode("utf-8", "replace")
        if dropped:
            text += f"\n[... {dropped} bytes of {self.name} dropped ...]\n"
        if tail:
            text += b"".join(tail).decode("utf-8", "replace")
        return text, dropped

    def read_ready(self) -> bool:
        """Take what the pipe holds (the reader found it readable); False at its end."""
        with self._lock:
            try:
                data = os.read(self._rfd, READ_SIZE)
            except BlockingIOError:
                return True
            if not data:
                return False
            self._take(data)
            return True

    def _take(self, data: bytes) -> None:
        if not self._active:
            self._idle_sent += len(data)
            if self._idle_sent <= BETWEEN_CELLS_CAP:
                self._emit(data, final=True)
            return
        if self._head_left > 0:
            part, data = data[: self._head_left], data[self._head_left :]
            self._head_left -= len(part)
            self._head.append(part)
            self._emit(part, final=False)
        if not data:
            return
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size > self._tail_cap and self._tail:
            excess = self._tail_size - self._tail_cap
            first = self._tail[0]
            if len(first) <= excess:
                self._tail.popleft()
                self._tail_size -= len(first)
                self._dropped += len(first)
            else:
                self._tail[0] = first[excess:]
                self._tail_size -= excess
                self._dropped += excess

    def _emit(self, data: bytes, *, final: bool) -> None:
        text = self._decoder.decode(data, final)
        if text:
            # the host may be gone: output is best effort, the cell goes on
            with contextlib.suppress(Exception):
                self._send(self.name, text)


class Reader:
    """The one thread that reads both captures' pipes, each chunk handed to its capture."""

    def __init__(self, out: StreamCapture, err: StreamCapture) -> None:
        self.out = out
        self.err = err
        self.ident = self._start()
        """The reader thread's ident (``threading`` does not list it)."""

    def after_fork(self) -> None:
        """In a kernel's copy: new pipes for both captures and a reader thread for them."""
        self.out.after_fork()
        self.err.after_fork()
        self.ident = self._start()

    def _start(self) -> int:
        readers = {capture.fd: capture for capture in (self.out, self.err)}
        return _thread.start_new_thread(_read, (readers,))


def _read(readers: dict[int, StreamCapture]) -> None:
    poller = select.poll()
    for fd in readers:
        poller.register(fd, select.POLLIN)
    while readers:
        for fd, _ in poller.poll():
            capture = readers.get(fd)
            if capture is not None and not capture.read_ready():
                poller.unregister(fd)
                del readers[fd]


def install(send: Callable[[str, str], None]) -> Reader:
    """Redirect fd 1/2 into captures read by one thread; rebind ``sys.stdout``/``sys.stderr``."""
    out = StreamCapture(1, "stdout", send)
    err = StreamCapture(2, "stderr", send)
    reader = Reader(out, err)
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    return reader
