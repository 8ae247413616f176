"""The channel's serving side: what the peer sends, checked, routed and answered.

:class:`ChannelServing` is the part of :class:`~sunroom.rpc.channel.Channel` that takes each
decoded message: a response goes to the call awaiting it (``_answer``), a notification is
checked against its schema and handed to ``on_notification``, a request is checked and served
by the handler, in a task or eagerly (:func:`~sunroom.rpc.eager.start_eagerly`), its answer
written only while the peer reads (the write buffer below its high-water mark). At most
:data:`MAX_INCOMING_REQUESTS` are served at once (the channel stops reading beyond that), and
error messages sent to the peer are cut to :data:`MAX_ERROR_TEXT` characters. Not used alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, cast

from sunroom.rpc.channel_receive import ChannelReceiving
from sunroom.rpc.codec import WireError
from sunroom.rpc.eager import start_eagerly
from sunroom.rpc.messages import Notification, Request, Response, RpcError
from sunroom.rpc.schema import Checker

RequestHandler = Callable[[str, object], Awaitable[object]]
NotificationHandler = Callable[[str, object], None]

MAX_INCOMING_REQUESTS: Final = 256
"""Requests from the peer served at once; beyond this the channel stops reading (backpressure)."""

MAX_ERROR_TEXT: Final = 1000
"""Longest error message the channel sends to the peer (longer ones are cut)."""


class RpcFailure(Exception):
    """Raise from a request handler to answer with exactly this error map."""

    def __init__(self, error: RpcError) -> None:
        super().__init__(error.message)
        self.error = error


def cut(text: str, longest: int = MAX_ERROR_TEXT) -> str:
    """*text* itself, or its first *longest* characters and how many were left out."""
    if len(text) <= longest:
        return text
    return f"{text[:longest]}... ({len(text) - longest} more characters)"


class ChannelServing(ChannelReceiving):
    """The serving side of a :class:`~sunroom.rpc.channel.Channel` (its base; not used alone).

    Hands responses to the channel's ``_answer`` and writes answers with its ``_write``.
    """

    _write_ready: asyncio.Event

    if TYPE_CHECKING:

        def _answer(self, msg: Response) -> None: ...

        def _write(
            self, message: list[object], tail: Sequence[bytes | bytearray | memoryview] = ()
        ) -> None: ...

    def _init_serving(
        self,
        *,
        handler: RequestHandler | None,
        on_notification: NotificationHandler | None,
        notifications: Mapping[str, Checker] | None,
        requests: Mapping[str, Checker] | None,
    ) -> None:
        self._handler = handler
        self._eager = False
        self._on_notification = on_notification
        self._notifications = notifications
        self._requests = requests
        self._tasks: set[asyncio.Task[None]] = set()
        self._serving: set[int] = set()
        self.refused = 0
        """Requests and notifications refused without closing the channel (a duplicate id of
        a request still being served, an unknown method): counted, never served."""

    def serve_with(self, handler: RequestHandler, *, eager: bool = False) -> None:
        """Serve the peer's requests with *handler* from now on (requests before it: refused).

        *eager*: start serving each request as soon as it is read (see
        :func:`~sunroom.rpc.eager.start_eagerly`) instead of in a new task: a handler that
        completes without waiting is answered in the same event-loop step (no task, no extra
        loop iteration); at its first wait, a task carries it on. Until then it runs outside
        any task, so it must not need one (``asyncio.timeout``, ``asyncio.current_task``)
        before it awaits :func:`~sunroom.rpc.eager.in_task`.
        """
        self._handler = handler
        self._eager = eager

    def _dispatch(self, msg: Request | Response | Notification) -> None:
        if type(msg) is Response:
            self._answer(msg)
        elif type(msg) is Notification:
            params = msg.params
            if self._notifications is not None:
                check = self._notifications.get(msg.method)
                if check is None:
                    self.refused += 1  # an unknown notification: dropped, counted
                    return
                params = check(params)
            if self._on_notification is not None:
                self._on_notification(msg.method, params)
        else:
            assert type(msg) is Request
            if msg.id in self._serving:
                self.refused += 1  # a duplicate id of a request still being served: dropped
                return
            params = msg.params
            known = True
            if self._requests is not None:
                check = self._requests.get(msg.method)
                known = check is not None
                if check is not None:
                    params = check(params)
            if not known:
                self.refused += 1  # answered MethodNotFound without reaching the handler
            self._serving.add(msg.id)
            self._start(msg.id, msg.method, params, known)

    def _start(self, req_id: int, method: str, params: object, known: bool) -> None:
        """Serve one request: eagerly (see :meth:`serve_with`) or in a task."""
        serving = self._serve(req_id, method, params, known=known)
        if not self._eager:
            self._track(self._loop.create_task(serving))
        elif (task := start_eagerly(self._loop, serving)) is not None:
            self._track(task)

    def _track(self, task: asyncio.Task[None]) -> None:
        # the task leaves the set itself, at the end of _serve (a done callback would cost
        # another turn of the event loop per request)
        self._tasks.add(task)
        if len(self._tasks) >= MAX_INCOMING_REQUESTS:
            self._pause("requests")

    def _untrack(self) -> None:
        if not self._tasks:
            return
        task = asyncio.current_task()
        if task is not None:
            self._tasks.discard(cast("asyncio.Task[None]", task))
        if "requests" in self._paused and len(self._tasks) < MAX_INCOMING_REQUESTS // 2:
            self._resume("requests")

    async def _writable(self) -> None:
        while not self._write_ready.is_set() and not self.closed.done():
            await self._write_ready.wait()

    async def _serve(self, req_id: int, method: str, params: object, *, known: bool = True) -> None:
        try:
            await self._serve_one(req_id, method, params, known=known)
        finally:
            self._serving.discard(req_id)
            self._untrack()

    async def _serve_one(self, req_id: int, method: str, params: object, *, known: bool) -> None:
        error: RpcError | None = None
        result: object = None
        if not self._write_ready.is_set():  # (no coroutine to create when it is)
            await self._writable()  # no work for a peer that is not reading its answers
        if self._handler is None or not known:
            error = RpcError("MethodNotFound", f"no handler for {cut(method, 60)!r}")
        else:
            try:
                result = await self._handler(method, params)
            except RpcFailure as exc:
                error = exc.error
            except asyncio.CancelledError:
                if self.closed.done():
                    return
                error = RpcError("Cancelled", "the call was cancelled on the host")
            except Exception as exc:
                error = RpcError(type(exc).__name__, str(exc))
        if not self._write_ready.is_set():
            await self._writable()
        if self.closed.done():
            return
        if error is not None:
            error = RpcError(cut(error.type, 200), cut(error.message), error.data)
            self._write(Response(req_id, error, None).to_wire())
            return
        try:
            self._write([1, req_id, None, result])
        except WireError as exc:
            self._write(Response(req_id, RpcError("EncodeError", cut(str(exc))), None).to_wire())
