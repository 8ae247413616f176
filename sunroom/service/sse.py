"""Server-sent events of a session, read from the store: :class:`EventStream`.

The stream replays the session's log after ``Last-Event-ID`` (or ``?after=``) and then follows
it live: every event comes from the store, so a client that reconnects with the last id it saw
loses nothing and gets nothing twice. Each SSE ``id`` is the event's seq in the log
(``Transcript`` events, internal, are skipped, so ids may jump). The server reads at most
``sse_batch`` events at a time (the bounded buffer) and gives a client ``sse_send_timeout_s``
to take each chunk: a stalled client is disconnected and resumes from the log. The stream ends
(``event: end``) when the session has no run in progress and everything was sent; when the
server shuts down it ends at once (a comment line, then the end of the response).

A *following* stream (``?follow=1``: the web view) does not end there: it sends ``event:
idle`` (the same data as ``end``) each time the session stops running with everything sent,
and goes on waiting, so a run another client starts is followed without a new request. It
does not keep the session from being released while idle, and ends only when the client
leaves, stalls, or the server shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import final

from starlette.types import Message, Receive, Scope, Send

from sunroom.service.config import ServiceConfig
from sunroom.service.journal import TRANSCRIPT
from sunroom.service.signals import Signals
from sunroom.store import EventStore, StoredEvent

__all__ = ["EventStream", "format_event"]

log = logging.getLogger("sunroom.service")


def format_event(event: StoredEvent) -> bytes:
    """One SSE message: ``id`` (seq), ``event`` (kind), ``data`` (JSON with seq, ts, type)."""
    data = {"seq": event.seq, "ts": event.ts, "type": event.kind, **event.payload}
    text = json.dumps(data, separators=(",", ":"))
    return f"id: {event.seq}\nevent: {event.kind}\ndata: {text}\n\n".encode()


class _Stalled(Exception):
    pass


@final
class EventStream:
    """An ASGI response streaming session *sid* from seq *after* on (see the module).

    *hold*, when given, is entered for as long as the stream runs (the session manager's
    :meth:`~sunroom.service.sessions.SessionManager.holding`: a followed session is never
    released while idle). *followed*: *signals* fire for every process's appends (the
    store is an ``AppendFollower``), so the stream waits for them instead of polling.
    """

    def __init__(
        self,
        *,
        store: EventStore,
        signals: Signals,
        config: ServiceConfig,
        sid: str,
        after: int,
        closing: asyncio.Event | None = None,
        hold: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        followed: bool = False,
        follow: bool = False,
    ) -> None:
        self._store = store
        self._signals = signals
        self._config = config
        self._sid = sid
        self._after = after
        self._closing = closing or asyncio.Event()
        self._hold = hold or contextlib.nullcontext
        self._followed = followed
        self._follow = follow

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream until the session has nothing more, the client leaves or stalls."""
        stream = asyncio.current_task()
        assert stream is not None

        async def watch() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    stream.cancel()
                    return

        async def stop() -> None:
            await self._closing.wait()
            stream.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        stopper = asyncio.get_running_loop().create_task(stop())
        try:
            with self._hold():
                await self._stream(send)
        except (_Stalled, OSError):
            return  # the connection is dropped; the client resumes with Last-Event-ID
        except asyncio.CancelledError:
            if watcher.done():
                return  # the client went away
            if stopper.done():  # the server shuts down: end the response cleanly
                with contextlib.suppress(Exception):
                    await self._send(send, b": server shutting down\n\n", more=False)
                return
            raise
        finally:
            watcher.cancel()
            stopper.cancel()
            await asyncio.wait([watcher, stopper])  # never swallows the stream's cancellation
            if not watcher.cancelled() and watcher.exception() is not None:
                log.error("the SSE client watcher failed", exc_info=watcher.exception())

    async def _send(self, send: Send, body: bytes, *, more: bool = True) -> None:
        try:
            await asyncio.wait_for(
                send({"type": "http.response.body", "body": body, "more_body": more}),
                self._config.sse_send_timeout_s,
            )
        except TimeoutError:
            raise _Stalled from None

    async def _stream(self, send: Send) -> None:
        cfg, sid = self._config, self._sid
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-store"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        after = self._after
        quiet = 0.0
        idle_sent = False
        while True:
            token = self._signals.token(sid)  # before reading: a later append wakes us
            events = await self._store.events(sid, after_seq=after, limit=cfg.sse_batch)
            if events:
                quiet = 0.0
                idle_sent = False
                chunk = b"".join(format_event(e) for e in events if e.kind != TRANSCRIPT)
                if chunk:
                    await self._send(send, chunk)
                after = events[-1].seq
                continue
            record = await self._store.get_session(sid)
            if record is None or record.status != "running":
                if not await self._store.events(sid, after_seq=after, limit=1):
                    status = record.status if record else "deleted"
                    end = json.dumps({"status": status, "last_seq": after})
                    if not self._follow or record is None:
                        await self._send(send, f"event: end\ndata: {end}\n\n".encode(), more=False)
                        return
                    if not idle_sent:
                        await self._send(send, f"event: idle\ndata: {end}\n\n".encode())
                        idle_sent = True
                else:
                    continue
            # other processes' appends wake us when the store follows them (PostgreSQL's
            # LISTEN/NOTIFY); otherwise they are polled for
            poll = cfg.sse_keepalive_s if self._followed else min(cfg.sse_keepalive_s, 1.0)
            if not await Signals.wait(token, poll):
                quiet += poll
                if quiet >= cfg.sse_keepalive_s:
                    quiet = 0.0
                    await self._send(send, b": keepalive\n\n")
