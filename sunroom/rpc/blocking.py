"""The kernel end of a connection: a blocking msgpack-RPC peer without a reader thread.

Reading follows a leader/follower scheme: whichever thread needs something from the socket
(the main thread waiting for its next request, or any thread waiting for the answer to its
call) becomes the reader when nobody else is reading, routes every message it reads (answers to
their callers, requests to the request queue) and hands the role on. A call made while no other
thread reads therefore costs no thread switch at all.

``SIGINT`` may interrupt a reader blocked in ``recv`` (that is how a timed-out cell stuck in a
host call is stopped); routing itself runs with ``SIGINT`` blocked, so an interrupt never lands
half-way through a frame. When the host goes away every waiter raises ``ConnectionError``.
Standard library and msgpack only.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; the C functions, unwrapped
import _socket
import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable

from sunroom.rpc.codec import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FRAME,
    DEFAULT_MAX_VALUES,
    HEADER,
    Framer,
    WireError,
    decode,
    take_frames,
)
from sunroom.rpc.messages import Notification, Request, Response, RpcError, parse_message

TYPE_CHECKING = False  # typing costs the kernel ~10 ms to import; annotations are lazy
if TYPE_CHECKING:
    pass

BIG_FRAME = 64 * 1024
"""Frames of at least this many bytes are received straight into a buffer of their own, and a
message whose last value is a binary of at least this many bytes is sent without copying it."""

SPARE_FRAME = 4 * 1024 * 1024
"""The buffer of a large frame of at most this many bytes is kept for the next frame of the
same size (a file transfer's chunks), so the memory is not mapped and faulted in afresh."""

_SIGINT = {_signal.SIGINT}
# _signal's own functions: the signal module's wrappers turn every mask into a set of enums
_sigmask = _signal.pthread_sigmask


class CallFailed(Exception):
    """The peer answered a call with an error; ``error`` holds the map."""

    def __init__(self, error: RpcError) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.error = error


class BlockingChannel:
    """Blocking msgpack-RPC endpoint over a connected stream socket it owns."""

    def __init__(
        self,
        sock: _socket.socket,
        *,
        on_notification: Callable[[Notification], None] | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        self._on_notification = on_notification
        self._max_frame = max_frame
        self._max_depth = max_depth
        # text the kernel's code made (a repr, a message, a file name) may hold lone
        # surrogates: sent escaped, never refused (the answer to execute would be lost)
        self._framer = Framer(
            max_frame=max_frame, max_values=DEFAULT_MAX_VALUES, escape_surrogates=True
        )
        self._chunk = bytearray(65536)
        self._view = memoryview(self._chunk)
        self._spare: bytearray | None = None
        self._next_id = 0
        self._serve(sock)

    def _serve(self, sock: _socket.socket) -> None:
        """Serve *sock*: new locks, then :meth:`_fresh`."""
        self._send_lock = threading.Lock()
        # `with self._lock` holds the condition's lock without Condition's Python-level
        # __enter__/__exit__ (five times per host call)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._fresh(sock)

    def _fresh(self, sock: _socket.socket) -> None:
        """Serve *sock* with nothing received, nothing waited for and no fds held."""
        sock.setblocking(True)
        self._sock = sock
        self._main = threading.main_thread().ident
        self._reading = False
        self._followers = 0  # threads waiting on _cond: nobody to notify when none
        self._buf = bytearray()
        self._frame: bytearray | None = None  # a large frame being received, and its fill
        self._fill = 0
        self._waiting: dict[int, Response | None] = {}
        self._requests: deque[Request] = deque()
        self._closed: BaseException | None = None
        self._fds: list[int] = []  # passed with the frames read (a fork's), in order

    def rebind(self, sock: _socket.socket) -> None:
        """In a forked copy of the kernel: serve *sock* from now on, as a channel just made.

        The fork held :attr:`send_lock` across it (the copy has no other thread, so it is
        released here) and nothing else: the condition's lock was free and nobody waited on
        it (the parent's channel was idle: ``input_idle``; its fork took its fds). The locks,
        buffers and the packer are kept, copied on write page by page as they are used (new
        ones would zero 64 KiB and build a condition in every copy). Called after
        :meth:`detach_fd`.
        """
        if self._send_lock.locked():
            self._send_lock.release()
        self._fresh(sock)

    @property
    def send_lock(self) -> threading.Lock:
        """The lock every send holds (a fork holds it, so no thread owns it in the child)."""
        return self._send_lock

    def raw_socket(self) -> _socket.socket:
        """The socket itself (a fork's copy closes the parent's)."""
        return self._sock

    def take_fds(self, count: int) -> list[int]:
        """The first *count* descriptors the peer passed (``SCM_RIGHTS``), in order.

        Descriptors come with the bytes of the frame they were sent with, so a request's
        are here once the request is (a fork's: ``Channel.request(..., fds=)`` on the host).
        Raises ValueError, closing every descriptor held, when fewer than *count* came.
        """
        with self._lock:
            if len(self._fds) < count:
                self._close_fds_locked()
                raise ValueError(f"the host passed no {count} descriptor(s) with the request")
            taken, self._fds = self._fds[:count], self._fds[count:]
            return taken

    def warm(self) -> None:
        """Frame an answer and decode a request, sending nothing (a fork's copy warms up so)."""
        decode(self._framer.frame([0, 0, "execute", {"code": ""}])[4:], max_depth=self._max_depth)
        self._framer.frame([1, 0, None, {"stdout": "", "value": None, "outputs": []}])

    def drop_fds(self) -> None:
        """Close every passed descriptor no request took (a refused fork's)."""
        with self._lock:
            self._close_fds_locked()

    def _close_fds_locked(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []

    def input_idle(self) -> bool:
        """Whether nothing received is waiting: no partial frame and no queued request."""
        with self._lock:
            return (
                not self._buf and self._frame is None and not self._requests and not self._reading
            )

    def detach_fd(self) -> int:
        """Let go of the socket without closing it; return its fd for the caller to close.

        Returns -1 when it was let go already. The channel is closed from then on, until
        :meth:`rebind`.
        """
        with self._lock:
            self._closed = self._closed or ConnectionError("detached")
        return int(self._sock.detach())

    def nothing_waiting(self) -> bool:
        """Whether nothing is waiting to be read: received or not, and no frame half-read."""
        if not self.input_idle():
            return False
        try:
            self._sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False  # the reader finds out what is wrong, and says so
        return False  # a byte, or the end: either is for the reader

    @property
    def closed(self) -> bool:
        """Whether the connection is gone."""
        return self._closed is not None

    # -- sending ---------------------------------------------------------------------------

    def send(self, message: list[object]) -> None:
        """Frame and send one message atomically; raises WireError or ConnectionError.

        A message the host would refuse (over the frame cap or ``DEFAULT_MAX_VALUES`` values)
        raises WireError here instead of being sent. A string UTF-8 cannot encode (a lone
        surrogate) is sent with that character backslash-escaped (``Framer``'s
        *escape_surrogates*), so the host only ever receives valid UTF-8.
        """
        with self._send_lock:
            self._send_holding_lock(message)

    def _send_holding_lock(self, message: list[object]) -> None:
        last = message[-1]
        if (
            type(last) in _BLOBS
            and isinstance(last, _BLOBS)
            and memoryview(last).nbytes >= BIG_FRAME
        ):
            # a file chunk: written from where it is, behind a head framed here
            parts = self._framer.frame_parts([*message[:-1], b""], [last])
            if self._closed is not None:
                raise ConnectionError("the host connection is closed")
            _send_parts(self._sock, parts)
            return
        data = self._framer.frame(message)  # one packer, used under the lock
        if self._closed is not None:
            raise ConnectionError("the host connection is closed")
        self._sock.sendall(data)

    def notify_holding_send_lock(self, method: str, params: object = None) -> None:
        """Send a notification while the caller holds :attr:`send_lock` (a fork, between forks).

        Raises ConnectionError when the connection is closed.
        """
        self._send_holding_lock([2, method, params])

    def notify(self, method: str, params: object = None) -> None:
        """Send a notification."""
        self.send([2, method, params])

    def respond(self, req_id: int, error: RpcError | None, result: object = None) -> None:
        """Answer request *req_id*; an unencodable result becomes an EncodeError answer."""
        try:
            self.send([1, req_id, None if error is None else error.to_wire(), result])
        except WireError as exc:
            self.send(Response(req_id, RpcError("EncodeError", str(exc)), None).to_wire())

    # -- receiving -------------------------------------------------------------------------

    def call(self, method: str, params: object = None) -> object:
        """Call the peer and block until it answers (any thread; many at once).

        Returns the result; raises CallFailed for an error answer, ConnectionError when the
        connection closes first, WireError when *params* cannot be sent. An interrupted call
        is forgotten; its late answer is dropped.
        """
        with self._lock:
            self._next_id = req_id = (self._next_id + 1) & 0xFFFFFFFF
            self._waiting[req_id] = None
        try:
            self.send([0, req_id, method, params])
            self._pump(lambda: self._waiting[req_id] is not None)
            resp = self._waiting[req_id]
        finally:
            with self._lock:
                self._waiting.pop(req_id, None)
        assert resp is not None
        if resp.error is not None:
            raise CallFailed(resp.error)
        return resp.result

    def next_request(self) -> Request:
        """Block until the peer sends a request and return it; ConnectionError when closed."""
        self._pump(lambda: bool(self._requests))
        with self._lock:
            return self._requests.popleft()

    def _pump(self, ready: Callable[[], bool]) -> None:
        while True:
            with self._lock:
                while not ready():
                    if self._closed is not None:
                        raise ConnectionError("the host connection is closed")
                    if not self._reading:
                        self._reading = True
                        break
                    self._followers += 1
                    try:
                        self._cond.wait()
                    finally:
                        self._followers -= 1
                else:
                    return
            self._read_once()

    def _read_once(self) -> None:
        """Read one chunk as the reader, route what it completes, give up the reader role."""
        frame = self._frame
        try:
            # recvmsg, not recv: a fork's descriptors come with its request (~0.2 us more)
            if frame is None:
                size, ancillary, flags, _ = self._sock.recvmsg_into(
                    [self._view], _FD_SPACE, _socket.MSG_CMSG_CLOEXEC
                )
            else:  # straight into the large frame's own buffer
                with memoryview(frame) as view:
                    size, ancillary, flags, _ = self._sock.recvmsg_into(
                        [view[self._fill :]], _FD_SPACE, _socket.MSG_CMSG_CLOEXEC
                    )
        except BaseException as exc:  # KeyboardInterrupt from a timed-out cell included
            if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | InterruptedError):
                # e.g. EBADF: close() on another thread won the race with this recv
                gone = ConnectionError(f"the host connection is gone: {exc}")
                with self._lock:
                    self._reading = False
                    self._closed = self._closed or gone
                    self._cond.notify_all()
                raise gone from exc
            with self._lock:
                self._reading = False
                if not isinstance(exc, KeyboardInterrupt | InterruptedError):
                    self._closed = exc
                self._cond.notify_all()
            raise
        masked = threading.get_ident() == self._main
        if masked:
            _sigmask(_signal.SIG_BLOCK, _SIGINT)
        try:
            with self._lock:
                self._reading = False
                if ancillary:
                    self._fds += _passed_fds(ancillary)
                    if flags & _socket.MSG_CTRUNC:  # more than a fork may pass: refused
                        self._close_fds_locked()
                        self._closed = WireError("the host passed too many descriptors")
                if not size:
                    self._closed = self._closed or ConnectionError("closed")
                elif self._closed is None:
                    try:
                        self._take(size)
                    except WireError as exc:
                        self._closed = exc
                if self._followers:  # (Condition.notify_all is Python code: skipped when idle)
                    self._cond.notify_all()
        finally:
            if masked:
                _sigmask(_signal.SIG_UNBLOCK, _SIGINT)

    def _take(self, size: int) -> None:
        """Route what the *size* bytes just read complete (under the lock, as the reader)."""
        frame = self._frame
        if frame is not None:
            self._fill += size
            if self._fill < len(frame):
                return
            self._frame = None
            with memoryview(frame) as view:
                message = decode(view, max_depth=self._max_depth)
            if len(frame) <= SPARE_FRAME:
                self._spare = frame
            self._route(parse_message(message))
            return
        buf = self._buf
        if not buf and size > 4:
            (length,) = HEADER.unpack_from(self._chunk)
            if length + 4 == size and length < BIG_FRAME and length <= self._max_frame:
                # exactly one frame (the common case): decoded without buffering it
                payload = bytes(self._view[4:size])
                self._route(parse_message(decode(payload, max_depth=self._max_depth)))
                return
        buf += self._view[:size]
        for payload in take_frames(buf, self._max_frame):
            self._route(parse_message(decode(payload, max_depth=self._max_depth)))
        if len(buf) >= 4:
            (length,) = HEADER.unpack_from(buf)
            if length >= BIG_FRAME:  # the rest goes straight into a buffer of its own
                spare, self._spare = self._spare, None
                frame = spare if spare is not None and len(spare) == length else bytearray(length)
                frame[: len(buf) - 4] = memoryview(buf)[4:]
                self._frame, self._fill = frame, len(buf) - 4
                buf.clear()

    def _route(self, msg: Request | Response | Notification) -> None:
        if type(msg) is Response:
            if msg.id in self._waiting:
                self._waiting[msg.id] = msg
            # else: the caller was interrupted and gave up; the host is trusted, drop it
        elif type(msg) is Request:
            self._requests.append(msg)
        else:
            assert type(msg) is Notification
            if self._on_notification is not None:
                self._on_notification(msg)

    def close(self) -> None:
        """Shut the socket down and close it; every waiter then raises ConnectionError."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(_socket.SHUT_RDWR)
        with self._lock:
            if self._closed is None:
                self._closed = ConnectionError("closed")
            self._cond.notify_all()
        self._sock.close()


_BLOBS = (bytes, bytearray, memoryview)

MAX_PASSED_FDS = 3 * 64
"""The most descriptors one read takes (a fork of 64 copies passes 2 or 3 each)."""

_FD_SPACE = _socket.CMSG_SPACE(MAX_PASSED_FDS * 4)


def _passed_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors in *ancillary* data (``SCM_RIGHTS``); others are not expected."""
    fds: list[int] = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds += memoryview(data)[:usable].cast("i").tolist()
    return fds


def _send_parts(sock: _socket.socket, parts: list[bytes | bytearray | memoryview]) -> None:
    """Send every buffer of *parts* in order (``sendmsg`` gathers them; no joined copy)."""
    views = [memoryview(part).cast("B") for part in parts]
    try:
        while views:
            sent = sock.sendmsg(views)
            while views and sent >= views[0].nbytes:
                sent -= views.pop(0).nbytes
            if sent:
                views[0] = views[0][sent:]
    finally:
        for view in views:
            view.release()
