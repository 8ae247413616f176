"""``Session``: the thin blocking twin of :class:`~sunroom.agent.session.AsyncSession`."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Self, final

from sunroom.agent import events as ev
from sunroom.agent.approvals import DEFAULT_TIMEOUT_S, ApprovalRequest, Policy
from sunroom.agent.branches import Choose
from sunroom.agent.budget import Budget, BudgetTracker, Spend
from sunroom.agent.bus import Subscription
from sunroom.agent.context import ContextPolicy
from sunroom.agent.hooks import Hooks
from sunroom.agent.options import Functions, Inputs, OutputSpec, SessionOptions
from sunroom.agent.presets import Preset
from sunroom.agent.redaction import Secrets
from sunroom.agent.result import RunResult
from sunroom.agent.session import AsyncSession
from sunroom.errors import UsageError
from sunroom.providers import Message, Model
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.portal import Portal, TwinState

__all__ = ["Session"]

if TYPE_CHECKING:
    from sunroom.embeddings.functions import Embedder
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.sandbox.packages import Packages


@final
class Session:
    """The blocking twin of :class:`AsyncSession`, for scripts and notebooks.

    Same arguments, same methods (blocking). Use ``with Session(...) as s: s.run("task")``. It
    runs the async core on a private loop thread; models built outside must be usable from
    that loop (prefer ``"provider:name"`` strings or fakes). :attr:`state` says where the
    session is in its life: after :meth:`close` (which cancels a running run, kills the kernel
    and stops the thread) every call raises ClosedError, and closing again does nothing.

    Raises UsageError for invalid options (before any kernel starts).
    """

    def __init__(
        self,
        *,
        model: Model | str,
        preset: Preset = "codeact",
        sub_model: Model | str | None = None,
        backend: str | Backend = backends.DEFAULT_BACKEND,
        limits: Limits | None = None,
        functions: Functions = (),
        inputs: Inputs = None,
        output: OutputSpec = None,
        budget: Budget | None = None,
        max_turns: int = 20,
        max_output_chars: int = 5000,
        secrets: Secrets | Mapping[str, str] | Iterable[str] = (),
        hooks: Hooks | None = None,
        context: ContextPolicy | None = None,
        system_prompt: str | None = None,
        max_depth: int = 1,
        predict_concurrency: int = 8,
        code_tool: bool = True,
        event_buffer: int = 1000,
        session_id: str | None = None,
        transcript: Sequence[Message] = (),
        spent: Spend | None = None,
        mcp: Iterable[McpServer] | Toolset = (),
        approvals: Mapping[str, Policy] | None = None,
        approval_timeout_s: float = DEFAULT_TIMEOUT_S,
        embeddings: Embedder | None = None,
        network: Network | None = None,
        packages: Packages | None = None,
    ) -> None:
        self._open(
            SessionOptions(
                model=model,
                preset=preset,
                sub_model=sub_model,
                backend=backend,
                limits=limits,
                functions=functions,
                inputs=inputs,
                output=output,
                budget=budget,
                max_turns=max_turns,
                max_output_chars=max_output_chars,
                secrets=secrets,
                hooks=hooks,
                context=context,
                system_prompt=system_prompt,
                max_depth=max_depth,
                predict_concurrency=predict_concurrency,
                code_tool=code_tool,
                event_buffer=event_buffer,
                session_id=session_id,
                transcript=transcript,
                spent=spent,
                mcp=mcp,
                approvals=approvals,
                approval_timeout_s=approval_timeout_s,
                embeddings=embeddings,
                network=network,
                packages=packages,
            )
        )

    @classmethod
    def from_options(cls, options: SessionOptions) -> Self:
        """A session built from *options*; see ``AsyncSession.from_options``.

        Raises UsageError for invalid options, and for a ``template`` (a Template belongs to
        the event loop it was made on: use ``AsyncSession``).
        """
        self = cls.__new__(cls)
        self._open(options)
        return self

    def _open(self, options: SessionOptions) -> None:
        if options.template is not None:
            raise UsageError(
                "a Template belongs to the event loop it was made on: "
                "use AsyncSession.from_options for a session from a template"
            )
        self._portal = Portal("sunroom-session-loop", what="the session")
        self._users = [1]  # sessions sharing the portal: this one and its forks
        self._state = TwinState.UNOPENED
        try:
            self._core: AsyncSession = self._portal.call(_build(options))
        except BaseException:
            self._portal.close()
            raise

    @classmethod
    def _copy_of(cls, parent: Session, core: AsyncSession) -> Session:
        fork = cls.__new__(cls)
        fork._portal, fork._users = parent._portal, parent._users
        fork._users[0] += 1
        fork._state = TwinState.OPENED
        fork._core = core
        return fork

    @property
    def core(self) -> AsyncSession:
        """The async session underneath."""
        return self._core

    @property
    def state(self) -> TwinState:
        """UNOPENED until started, OPENED while usable, CLOSED for good after close()."""
        return self._state

    @property
    def session_id(self) -> str:
        """The id events and results carry."""
        return self._core.session_id

    @property
    def preset(self) -> Preset:
        """The preset this session was built with."""
        return self._core.preset

    @property
    def parent_id(self) -> str | None:
        """The id of the session this one was forked from (None: not a fork)."""
        return self._core.parent_id

    @property
    def branch(self) -> str | None:
        """The branch id when this is a branch of a branched run (its events carry it)."""
        return self._core.branch

    @property
    def limits(self) -> Limits:
        """The kernel's limits."""
        return self._core.limits

    @property
    def tracker(self) -> BudgetTracker:
        """The budget tracker (spend so far, shared with nested sessions)."""
        return self._core.tracker

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the kernel (idempotent); raises ClosedError after close()."""
        self._portal.call(self._core.start())
        self._state = TwinState.OPENED

    def run(self, task: str, *, branches: int | None = None, choose: Choose = "first") -> RunResult:
        """Run *task* (``branches=k``: branched) to its terminal result; see ``AsyncSession.run``.

        A callable *choose* runs on the session's loop thread.
        """
        return self._portal.call(self._core.run(task, branches=branches, choose=choose))

    def fork(self) -> Session:
        """A new session continuing from this one's state; see ``AsyncSession.fork``.

        The fork shares this session's event-loop thread, which stops with the last of them.
        """
        return Session._copy_of(self, self._portal.call(self._core.fork()))

    def send(self, message: str) -> None:
        """Send a user message (starts a run when idle); see ``AsyncSession.send``."""
        self._portal.call(self._core.send(message))

    def result(self) -> RunResult:
        """Block until the current run ends and return its result."""
        return self._portal.call(self._core.result())

    @property
    def running(self) -> bool:
        """Whether a run is in progress."""
        return self._core.running

    @property
    def messages(self) -> tuple[Message, ...]:
        """The transcript as the model sees it (redacted)."""
        return self._core.messages

    def approve(
        self, call_id: str, *, allow: bool = True, reason: str | None = None, lease: bool = False
    ) -> None:
        """Answer an approval request (safe from any thread); see ``AsyncSession.approve``."""
        self._portal.call(self._core.approve(call_id, allow=allow, reason=reason, lease=lease))

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """The host calls waiting for an answer now; see ``AsyncSession.pending_approvals``."""
        return self._portal.call(_pending(self._core))

    def interrupt(self, reason: str) -> None:
        """Steer the running run (safe from any thread)."""
        self._portal.call_soon(self._core.interrupt, reason)

    def cancel(self) -> None:
        """Cancel the running run (its result becomes ``cancelled``); no-op when idle."""
        self._portal.call_soon(self._core.cancel)

    def events(self, *, maxsize: int | None = None) -> Generator[ev.Event, None, None]:
        """A blocking iterator of every event published from now on (subscribed at once).

        It ends when the session closes. Stopping early (``break``, or closing the iterator)
        unsubscribes at once.
        """
        sub = self._portal.call(_subscribe(self._core, maxsize))
        return self._iterate(sub)

    def _iterate(self, sub: Subscription) -> Generator[ev.Event, None, None]:
        try:
            while True:
                try:
                    yield self._portal.call(_next(sub))
                except StopAsyncIteration:
                    return
        finally:
            if not self._portal.closed:
                self._portal.call_soon(sub.close)

    def close(self) -> None:
        """Close the session and stop the loop thread. Idempotent."""
        if self._state is TwinState.CLOSED:
            return
        self._state = TwinState.CLOSED
        try:
            self._portal.call(self._core.aclose())
        finally:
            self._users[0] -= 1
            if self._users[0] == 0:
                self._portal.close()


async def _build(options: SessionOptions) -> AsyncSession:
    return AsyncSession.from_options(options)


async def _subscribe(core: AsyncSession, maxsize: int | None) -> Subscription:
    return core.events(maxsize=maxsize)


async def _next(sub: Subscription) -> ev.Event:
    return await sub.__anext__()


async def _pending(core: AsyncSession) -> tuple[ApprovalRequest, ...]:
    return core.pending_approvals()
