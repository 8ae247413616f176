"""``Session``: the thin blocking twin of :class:`~sunroom.agent.session.AsyncSession`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Self, final

from sunroom.agent import events as ev
from sunroom.agent.bus import Subscription
from sunroom.agent.result import RunResult
from sunroom.agent.session import AsyncSession
from sunroom.sandbox.portal import Portal

__all__ = ["Session"]


@final
class Session:
    """The blocking twin of :class:`AsyncSession` (same arguments), for scripts and notebooks.

    Use ``with Session(...) as s: s.run("task")``. It runs the async core on a private loop
    thread; models built outside must be usable from that loop (prefer ``"provider:name"``
    strings or fakes). :meth:`close` cancels a running run, kills the kernel and stops the
    thread.
    """

    def __init__(self, **options: Any) -> None:
        self._portal = Portal("sunroom-session-loop")
        self._closed = False
        try:
            self._core: AsyncSession = self._portal.call(_build(options))
        except BaseException:
            self._portal.close()
            raise

    @property
    def core(self) -> AsyncSession:
        """The async session underneath."""
        return self._core

    def __enter__(self) -> Self:
        self._portal.call(self._core.start())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, task: str) -> RunResult:
        """Run *task* to its terminal result."""
        return self._portal.call(self._core.run(task))

    def send(self, message: str) -> None:
        """Send a user message (starts a run when idle)."""
        self._portal.call(self._core.send(message))

    def result(self) -> RunResult:
        """Block until the current run ends and return its result."""
        return self._portal.call(self._core.result())

    def interrupt(self, reason: str) -> None:
        """Steer the running run (safe from any thread)."""
        self._portal.call_soon(self._core.interrupt, reason)

    def events(self, *, maxsize: int | None = None) -> Iterator[ev.Event]:
        """A blocking iterator of events from now on; it ends when the session closes."""
        sub = self._portal.call(_subscribe(self._core, maxsize))
        while True:
            try:
                yield self._portal.call(_next(sub))
            except StopAsyncIteration:
                return

    def close(self) -> None:
        """Close the session and stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self._core.aclose())
        finally:
            self._portal.close()


async def _build(options: dict[str, Any]) -> AsyncSession:
    return AsyncSession(**options)


async def _subscribe(core: AsyncSession, maxsize: int | None) -> Subscription:
    return core.events(maxsize=maxsize)


async def _next(sub: Subscription) -> ev.Event:
    return await sub.__anext__()
