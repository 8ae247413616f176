"""The kernel end of a connection: a blocking msgpack-RPC peer with one reader thread.

Any thread may :meth:`BlockingChannel.call` (many at once) or :meth:`notify`. The reader
thread routes responses to their waiting callers and hands incoming requests and
notifications to callbacks (the kernel queues requests for its main thread). When the host
goes away the channel closes, every waiting call raises ``ConnectionError`` and ``on_close``
runs (the kernel exits). Standard library and msgpack only.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from sunroom.rpc.codec import (
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FRAME,
    WireError,
    decode,
    frame,
    take_frames,
)
from sunroom.rpc.messages import Notification, Request, Response, RpcError, parse_message


class CallFailed(Exception):
    """The peer answered a call with an error; ``error`` holds the map."""

    def __init__(self, error: RpcError) -> None:
        super().__init__(f"{error.type}: {error.message}")
        self.error = error


class _Slot:
    __slots__ = ("lock", "response")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.response: Response | None = None


class BlockingChannel:
    """Blocking msgpack-RPC endpoint over a connected stream socket it owns."""

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_request: Callable[[Request], None],
        on_notification: Callable[[Notification], None] | None = None,
        on_close: Callable[[BaseException | None], None] | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        sock.setblocking(True)
        self._sock = sock
        self._on_request = on_request
        self._on_notification = on_notification
        self._on_close = on_close
        self._max_frame = max_frame
        self._max_depth = max_depth
        self._send_lock = threading.Lock()
        self._id_lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, _Slot] = {}
        self._closed: BaseException | None = None
        self._reader = threading.Thread(target=self._read_loop, name="sunroom-rpc", daemon=True)

    def start(self) -> None:
        """Start the reader thread."""
        self._reader.start()

    @property
    def closed(self) -> bool:
        """Whether the connection is gone."""
        return self._closed is not None

    def send(self, message: list[Any]) -> None:
        """Frame and send one message atomically; raises WireError or ConnectionError."""
        data = frame(message, max_frame=self._max_frame)
        with self._send_lock:
            if self._closed is not None:
                raise ConnectionError("the host connection is closed")
            self._sock.sendall(data)

    def notify(self, method: str, params: Any = None) -> None:
        """Send a notification."""
        self.send([2, method, params])

    def respond(self, req_id: int, error: RpcError | None, result: Any = None) -> None:
        """Answer request *req_id*; an unencodable result becomes an EncodeError answer."""
        try:
            self.send(Response(req_id, error, result).to_wire())
        except WireError as exc:
            self.send(Response(req_id, RpcError("EncodeError", str(exc)), None).to_wire())

    def call(self, method: str, params: Any = None) -> Any:
        """Call the peer and block until it answers.

        Returns the result; raises CallFailed for an error answer, ConnectionError when the
        connection closes first, WireError when *params* cannot be sent.
        """
        slot = _Slot()
        with self._id_lock:
            self._next_id = req_id = (self._next_id + 1) & 0xFFFFFFFF
            self._pending[req_id] = slot
        try:
            self.send([0, req_id, method, params])
            slot.lock.acquire()
        finally:
            self._pending.pop(req_id, None)
        resp = slot.response
        if resp is None:
            raise ConnectionError("the host connection closed during the call")
        if resp.error is not None:
            raise CallFailed(resp.error)
        return resp.result

    def close(self) -> None:
        """Shut the socket down, let the reader thread finish, close the socket."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        if self._reader.is_alive() and threading.current_thread() is not self._reader:
            self._reader.join(timeout=5)
        self._sock.close()

    def _read_loop(self) -> None:
        exc: BaseException | None = None
        buf = bytearray()
        try:
            while True:
                chunk = self._sock.recv(262144)
                if not chunk:
                    break
                buf += chunk
                for payload in take_frames(buf, self._max_frame):
                    self._route(parse_message(decode(payload, max_depth=self._max_depth)))
        except BaseException as err:  # the reader must never die silently
            exc = err
        with self._send_lock:
            self._closed = exc or ConnectionError("closed")
        for slot in list(self._pending.values()):
            if slot.lock.locked():
                slot.lock.release()
        if self._on_close is not None:
            self._on_close(exc)

    def _route(self, msg: Request | Response | Notification) -> None:
        if type(msg) is Response:
            slot = self._pending.get(msg.id)
            if slot is None:  # the caller gave up (interrupted); the host is trusted
                return
            slot.response = msg
            slot.lock.release()
        elif type(msg) is Request:
            self._on_request(msg)
        else:
            assert type(msg) is Notification
            if self._on_notification is not None:
                self._on_notification(msg)
