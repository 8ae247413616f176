"""Agent sessions: :class:`AsyncSession`, the async core (``Session`` is its sync twin).

A session owns one kernel, a transcript, an event bus and a budget tracker. Each run (``run``,
or ``send`` when idle) loops: model turn → cells the reply asked for → output back to the
model, until a terminal :class:`~sunroom.agent.result.RunResult`. The loop itself is in
:mod:`sunroom.agent.loop`. This module holds the public surface (start, runs, steering,
approvals, close); the session is built in :mod:`sunroom.agent.session_setup`, hands its parts
the callbacks of :mod:`sunroom.agent.session_wiring`, and forks and runs branches in
:mod:`sunroom.agent.session_forks`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, final

from sunroom.agent import branches as br
from sunroom.agent.approvals import DEFAULT_TIMEOUT_S, ApprovalRequest, Policy
from sunroom.agent.branches import Choose
from sunroom.agent.budget import Budget, Spend
from sunroom.agent.bus import Subscription
from sunroom.agent.context import ContextPolicy
from sunroom.agent.hooks import Hooks
from sunroom.agent.presets import Preset
from sunroom.agent.prompts import system_prompt_for
from sunroom.agent.redaction import Secrets
from sunroom.agent.result import RunResult
from sunroom.agent.session_forks import SessionForks
from sunroom.agent.session_setup import Inputs, OutputSpec
from sunroom.errors import ClosedError, UsageError
from sunroom.providers import Message, Model, SystemMessage
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.functions import HostFunction
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.packages import PACKAGES_HEADING, notable_line

_MCP_HEADING = "MCP tools, one module per server"


if TYPE_CHECKING:
    from sunroom.embeddings.functions import Embedder
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.sandbox.packages import Packages
    from sunroom.sandbox.template import Template

__all__ = ["AsyncSession", "Inputs", "OutputSpec", "system_prompt_for"]


@final
class AsyncSession(SessionForks):
    """An agent that acts by writing Python in an isolated kernel.

    Use ``async with AsyncSession(model=..., ...) as s: result = await s.run("task")``.
    Entering starts the kernel; leaving (or :meth:`aclose`) cancels a running run (its result
    is ``cancelled``), kills the kernel, closes models built from strings, and ends every
    event subscription.

    Args:
        model: the root model, a :class:`~sunroom.providers.Model` or a ``"provider:name"``
            string (then the session builds, owns and closes it).
        preset: ``"codeact"``, ``"rlm"`` or ``"typed"`` (see :mod:`sunroom.agent.presets`).
        sub_model: the model ``predict``/``predict_many`` use (default: ``model``).
        backend / limits: passed to :class:`~sunroom.sandbox.kernel.AsyncKernel`.
        functions: extra host functions for the kernel.
        inputs: variables to bind (a mapping; for ``typed`` also a model/dataclass instance).
        output: the type ``submit`` must satisfy (a pydantic model, dataclass or type).
        budget: limits on model calls, tokens, cost and wall time, shared with sub-calls.
        max_turns: root model turns per run.
        max_output_chars: characters of a cell's output shown to the model (head and tail).
        secrets: values never shown to a model, an event or a log (redacted): a
            ``Secrets`` registry, a name → value mapping or plain values.
        hooks: callbacks that may veto a cell or a host call.
        context: a ``ContextPolicy`` (warnings and compaction); None for the default policy.
        system_prompt: extra instructions appended to the generated system prompt.
        max_depth: nesting of sessions allowed (1: ``predict(recursive=True)`` is refused).
        predict_concurrency: ``predict_many`` items in flight at once.
        code_tool: offer the ``execute_code`` tool (False: fenced code blocks only).
        event_buffer: routine events buffered per subscriber before dropping.
        session_id: the id events and results carry (default: a fresh uuid); a service resuming
            a stored session passes its own.
        transcript: a recorded transcript to continue (e.g. rebuilt from the event log after a
            crash); the kernel is fresh, nothing in it is re-run.
        spent: what the session had already spent before a resume (model calls, tokens, cost);
            it counts against ``budget`` (wall time restarts).
        template: start the kernel as a fork of this :class:`~sunroom.Template` (its setup
            done; its backend and limits apply: omit ``limits``). The session's functions and
            inputs are added on top; nested sessions start their own kernels.
        mcp: MCP servers (:func:`sunroom.mcp.stdio`, :func:`sunroom.mcp.http`) bound in the
            kernel as one module per server; their calls pass the same hooks, events, budgets
            and redaction as host functions, and the prompt lists their signatures. Nested
            (``predict(recursive=True)``) sessions do not get them. See ``docs/mcp.md``.
        approvals: approval policies by function name or glob (``{"github.*": "ask"}``):
            ``"allow"``, ``"deny"``, ``"ask"`` or a callable; see docs/approvals.md and
            :mod:`sunroom.agent.approvals` for the precedence.
        approval_timeout_s: how long a call waits for an answer to ``ask`` before it is denied.
        embeddings: an embedder (:class:`~sunroom.embeddings.OnnxEmbedder`, loaded once and
            shared by any number of sessions) bound in the kernel as the host functions
            ``embed`` and ``search`` (:mod:`sunroom.embeddings.functions`). Their calls pass the
            same hooks, events and approvals as host functions and count against
            ``Budget.max_embedding_calls``; the prompt lists them, and the ``rlm`` preset's
            tells the model to rank chunks with ``search`` first. Forks and nested sessions
            get them too. See ``docs/embeddings.md``.
        network: a :class:`~sunroom.Network` policy for the kernel (bwrap and docker): the
            hosts it allows are reachable through a proxy on the host, nothing else is. Every
            connection is a :class:`~sunroom.agent.events.NetworkConnection` event and its
            bytes count against ``Budget.max_network_bytes``; the prompt names the hosts.
            Nested sessions get the same policy. See ``docs/network.md``.
        packages: where the kernel's ``install()`` finds packages and its budget
            (:class:`~sunroom.Packages`; docs/packages.md); the prompt lists the kernel's
            notable packages either way. Not with ``template=`` (it has its own).

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
        functions: Iterable[Callable[..., Any] | HostFunction] = (),
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
        template: Template | None = None,
        mcp: Iterable[McpServer] | Toolset = (),
        approvals: Mapping[str, Policy] | None = None,
        approval_timeout_s: float = DEFAULT_TIMEOUT_S,
        embeddings: Embedder | None = None,
        network: Network | None = None,
        packages: Packages | None = None,
    ) -> None:
        self._setup(
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
            template=template,
            mcp=mcp,
            approvals=approvals,
            approval_timeout_s=approval_timeout_s,
            embeddings=embeddings,
            network=network,
            packages=packages,
            tracker=None,
            depth=0,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Start the kernel and install predict/submit helpers (idempotent).

        Raises KernelStartError / SandboxUnavailableError when the kernel cannot start.
        """
        if self._closed:
            raise ClosedError("the session is closed")
        if self._started:
            return
        try:
            await self._kernel.start()
            await self._install_shim()
        except BaseException:
            await self._kernel.aclose()
            raise
        system = self._loop.messages[0]
        tools = self._toolset.describe() if self._toolset is not None else ""
        if tools and isinstance(system, SystemMessage) and _MCP_HEADING not in system.text:
            self._loop.messages[0] = system = SystemMessage(
                f"{system.text}\n\n{_MCP_HEADING} (call them from your code; "
                "help(module.tool) shows the full description):\n"
                f"```python\n{self._redact(tools)}\n```"
            )
        if isinstance(system, SystemMessage) and PACKAGES_HEADING not in system.text:
            line = await self._packages_line()
            if line:
                self._loop.messages[0] = SystemMessage(f"{system.text}\n\n{self._redact(line)}")
        self._started = True

    async def _packages_line(self) -> str:
        """The prompt's line of notable packages; empty for a kernel without sunroom's runtime."""
        try:
            listing = await self._kernel.list_packages()
        except UsageError:  # raised only for a non-Python Jupyter kernel: nothing to list
            return ""
        return notable_line(listing)

    async def aclose(self) -> None:
        """Cancel a running run, kill the kernel, close owned models, end subscriptions.

        Idempotent.
        """
        if self._closed:
            return
        self._closed = True
        if self._owns_approvals:
            self._approvals.deny_all("the session closed while this call waited for approval")
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])  # the run never raises; our own cancel propagates
        try:
            for kid in self._branches:  # left only if the branched run was cancelled twice
                await kid.aclose()
            await self._kernel.aclose()
        finally:
            for owned in self._owned:
                with contextlib.suppress(Exception):
                    await owned.aclose()
            if self._owns_bus:  # a branch publishes on its parent's bus
                self._bus.close()

    # -- runs ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether a run is in progress."""
        return self._task is not None and not self._task.done()

    async def send(self, message: str) -> None:
        """Send a user message: it starts a run when idle, or joins the running one.

        A message for a running run is added to the transcript before its next model call.

        Raises ClosedError after close, UsageError for a non-str message.
        """
        if not isinstance(message, str):
            raise UsageError("message must be a str")
        if self._closed:
            raise ClosedError("the session is closed")
        await self.start()
        if self.running:
            self._steer(message, interrupt=False)
            return
        self._submission.reset()
        if self._owns_approvals:
            self._approvals.new_run()  # leases hold for one run
        self._loop.steer(message, interrupt=False)
        self._task = asyncio.get_running_loop().create_task(
            self._loop.run(self.session_id), name=f"sunroom-session-{self.session_id[:8]}"
        )

    async def result(self) -> RunResult:
        """Wait for the current (or last) run to end and return its result.

        Cancelling this wait does not cancel the run. Raises UsageError if nothing was sent.
        """
        if self._task is None:
            raise UsageError("no run has started: call send() or run() first")
        return await asyncio.shield(self._task)

    async def run(
        self, task: str, *, branches: int | None = None, choose: Choose = "first"
    ) -> RunResult:
        """Run *task* to its terminal result (one-shot use).

        With ``branches=k`` (2-64) the run is *branched*: the session forks into k branches
        (each a :meth:`fork`: its own copy of the kernel and of the transcript, the shared
        budget) that run *task* concurrently, and *choose* picks the answer: ``"first"`` (the
        first branch to succeed; the others are closed at once), ``"vote"`` (the largest group
        of equal successful outputs) or a callable ``choose(results)`` returning the winner's
        index, its result or None (see :mod:`sunroom.agent.branches`). Afterwards the session
        continues from the winner: its transcript and its kernel become the session's; the
        session's former kernel and every other branch are closed. When no branch is chosen the
        session keeps its state from before the run. The result is the winner's (status,
        output, error, turns) with the usage and cost of every branch and the session's id; no
        winner: the most common status of the branches (``rejected`` when the callable turned
        every branch down). Branch events carry ``branch`` (docs/agent.md, "Branches").
        ``branches=None`` or 1 is a plain run, and *choose* is not used.

        Cancelling this call cancels the run. Raises UsageError if a run is in progress or for
        invalid *branches*/*choose*; a branched run raises what :meth:`fork` raises when the
        kernel cannot be forked.
        """
        if self.running:
            raise UsageError("a run is already in progress; use send() to add a message")
        k = br.branch_count(branches)
        label = br.choose_label(choose)
        if k == 1:
            await self.send(task)
        else:
            if not isinstance(task, str):
                raise UsageError("task must be a str")
            kids = await self._fork_sessions(k)
            self._task = asyncio.get_running_loop().create_task(
                self._branched(task, kids, choose, label),
                name=f"sunroom-session-{self.session_id[:8]}-branches",
            )
        try:
            return await self.result()
        except asyncio.CancelledError:
            self.cancel()
            raise

    # -- approvals and steering ------------------------------------------------------------

    async def approve(
        self, call_id: str, *, allow: bool = True, reason: str | None = None, lease: bool = False
    ) -> None:
        """Answer the approval request *call_id* (an ``ApprovalRequested`` event's).

        ``allow=False`` denies the call (the kernel gets ApprovalDenied with *reason*);
        ``lease=True`` makes the answer hold for every later call of that function until the
        run ends (not into the next run). The answer is published as ``ApprovalAnswered``.
        Branches and nested sessions share their session's requests.

        Raises ApprovalNotPending (an unknown or already answered id), UsageError (bad
        arguments).
        """
        self._approvals.answer(call_id, allow=allow, reason=reason, lease=lease)

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """The host calls waiting for an answer now, oldest first."""
        return self._approvals.pending()

    def interrupt(self, reason: str) -> None:
        """Steer the running run: *reason* reaches the model before its next call."""
        if self.running:
            self._steer(self._redact(reason), interrupt=True)

    def cancel(self) -> None:
        """Cancel the running run (its result becomes ``cancelled``); no-op when idle."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def events(self, *, maxsize: int | None = None) -> Subscription:
        """Subscribe to every event published from now on (``async for e in s.events()``).

        The iteration ends when the session closes. A subscriber more than *maxsize* routine
        events behind loses routine ones (counted in ``dropped``), never control events.
        """
        return self._bus.subscribe(maxsize=maxsize)

    @property
    def messages(self) -> tuple[Any, ...]:
        """The transcript as the model sees it (redacted)."""
        return tuple(self._loop.messages)
