"""The thread that runs every kernel's egress proxy, on its own event loop (uvloop when installed).

A proxy works on every chunk of every connection of its kernel. On the caller's event loop
that work would compete with the caller's own (an agent's turns, a service's requests), and
asyncio's own loop costs about 0.6 ms more CPU per proxied HTTPS request than uvloop's
(benchmarks/egress.py, docs/network.md). So the kernels' proxies (:class:`~sunroom.sandbox.
network.Egress`) run here, in one daemon thread per host process, whatever loop the caller
runs; the proxy's own code is loop-agnostic and can still run on any loop.

What crosses back: the callers' callbacks run on the caller's loop (:func:`on_caller`), in the
order the proxy made them; awaiting work here from the caller's loop is :func:`on_egress`. A
child process made by ``fork()`` gets a new thread on first use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import TypeVar

__all__ = ["egress_loop", "on_caller", "on_egress"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_lock = threading.Lock()
_running: tuple[int, asyncio.AbstractEventLoop, threading.Thread] | None = None


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # not installed (or not this platform): asyncio's own loop
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def egress_loop() -> asyncio.AbstractEventLoop:
    """The egress thread's loop, the thread started on first use (again after a fork)."""
    global _running
    with _lock:
        if _running is not None:
            pid, loop, thread = _running
            if pid == os.getpid() and thread.is_alive():
                return loop
        loop = _new_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        thread = threading.Thread(target=run, name="sunroom-egress", daemon=True)
        thread.start()
        ready.wait()
        _running = (os.getpid(), loop, thread)
        return loop


async def on_egress(work: Coroutine[object, object, T]) -> T:
    """Run *work* on the egress loop and wait for it here; cancelling this cancels it there."""
    future = asyncio.run_coroutine_threadsafe(work, egress_loop())
    return await asyncio.wrap_future(future)


def on_caller(callback: Callable[..., object]) -> Callable[..., None]:
    """*callback*, to be called from the egress thread and run on the current (caller's) loop.

    Calls keep their order. Once the caller's loop is closed a call is dropped (logged at
    debug level): nothing is left to receive it.
    """
    owner = asyncio.get_running_loop()

    def call(*args: object) -> None:
        try:
            owner.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the caller's loop is closed
            log.debug("egress: dropped a callback for a closed event loop")

    return call
