"""Agent sessions: :class:`AsyncSession`, the async core (``Session`` is its sync twin).

A session owns one kernel, a transcript, an event bus and a budget tracker. Each run (``run``,
or ``send`` when idle) loops: model turn → cells the reply asked for → output back to the
model, until a terminal :class:`~sunroom.agent.result.RunResult`. The loop itself is in
:mod:`sunroom.agent.loop`.

This module reads top to bottom: the session's options (:class:`~sunroom.agent.options.
SessionOptions`, checked once) become a frozen record of its parts (:class:`_Parts`: models,
approvals, bus, guard, budget, the callbacks of :mod:`sunroom.agent.wiring`, submission,
predictor, MCP toolset); then the kernel, the system prompt and the loop, which a branched run
may swap for a branch's; then the public surface (start, runs, steering, approvals, close);
then forks, branched runs (the picking in :mod:`sunroom.agent.branches`) and nested sessions.
A root session, a nested one (``predict(recursive=True)``), a fork and a branch are all built
by :meth:`AsyncSession._build`, with different :class:`_Links`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self, final

from sunroom import tracing
from sunroom.agent import branches as br
from sunroom.agent import events as ev
from sunroom.agent.approvals import DEFAULT_TIMEOUT_S, ApprovalRequest, Approvals, Policy
from sunroom.agent.branches import Choose
from sunroom.agent.budget import Budget, BudgetTracker, Spend
from sunroom.agent.bus import EventBus, Subscription
from sunroom.agent.calls import ModelGate, Publish, instrument
from sunroom.agent.context import ContextPolicy
from sunroom.agent.guard import Guard, context_guard
from sunroom.agent.hooks import Hooks
from sunroom.agent.live import LiveOutput
from sunroom.agent.loop import Loop, LoopConfig
from sunroom.agent.options import Functions, Inputs, OutputSpec, SessionOptions
from sunroom.agent.predict import Predictor, TreeLink
from sunroom.agent.presets import Preset, bind_inputs
from sunroom.agent.prompts import describe_functions, system_prompt_for
from sunroom.agent.redaction import Secrets
from sunroom.agent.result import RunResult
from sunroom.agent.shim import SHIM_SOURCE
from sunroom.agent.submit import Submission
from sunroom.agent.wiring import SessionWiring
from sunroom.errors import AgentError, ClosedError, KernelError, UsageError
from sunroom.providers import Message, Model, SystemMessage
from sunroom.providers import model as build_model
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.functions import FunctionRegistry, HostFunction, as_host_function
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.packages import PACKAGES_HEADING, notable_line

if TYPE_CHECKING:
    from sunroom.embeddings.functions import Embedder
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.sandbox.packages import Packages
    from sunroom.sandbox.template import Template
    from sunroom.tracing import Span

__all__ = ["AsyncSession", "Inputs", "OutputSpec", "SessionOptions", "system_prompt_for"]

_MCP_HEADING = "MCP tools, one module per server"


@dataclass(frozen=True, slots=True)
class _Links:
    """What ties a session to another: none for a root session.

    A nested session (``predict(recursive=True)``) shares its root's *tracker*, *broker* and
    *approval_publish* one *depth* deeper; a fork gets a copied *kernel* and the parent's
    *tracker*; a branch also publishes on its parent's *bus* under its *branch* id.
    """

    tracker: BudgetTracker | None = None
    depth: int = 0
    kernel: AsyncKernel | None = None
    bus: EventBus | None = None
    broker: Approvals | None = None
    approval_publish: Publish | None = None
    branch: str | None = None
    parent_id: str | None = None
    tree: TreeLink | None = None
    """Where a nested session's sub-calls go: its root's recursion tree (None: its own)."""


@dataclass(frozen=True, slots=True)
class _Parts:
    """What a session is made of, built once by :meth:`AsyncSession._build`."""

    options: SessionOptions
    """The options it was built from (a fork's are these with a new id and transcript)."""
    model: Model
    sub_model: Model
    owned: tuple[Model, ...]
    """Models built from ``"provider:name"`` strings: closed with the session."""
    approvals: Approvals
    owns_approvals: bool
    bus: EventBus
    owns_bus: bool
    secrets: Secrets
    guard: Guard
    wiring: SessionWiring
    gate: ModelGate
    submission: Submission
    predictor: Predictor
    live: LiveOutput
    """The running cell's output as events (the kernel's ``on_output``)."""
    toolset: Toolset | None
    depth: int


@final
class AsyncSession:
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
        template: Template | None = None,
        mcp: Iterable[McpServer] | Toolset = (),
        approvals: Mapping[str, Policy] | None = None,
        approval_timeout_s: float = DEFAULT_TIMEOUT_S,
        embeddings: Embedder | None = None,
        network: Network | None = None,
        packages: Packages | None = None,
    ) -> None:
        self._build(
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
                template=template,
                mcp=mcp,
                approvals=approvals,
                approval_timeout_s=approval_timeout_s,
                embeddings=embeddings,
                network=network,
                packages=packages,
            ),
            _Links(),
        )

    @classmethod
    def from_options(cls, options: SessionOptions) -> Self:
        """A session built from *options* (what the keyword arguments build; see the class).

        Raises UsageError for invalid options (before any kernel starts).
        """
        self = cls.__new__(cls)
        self._build(options, _Links())
        return self

    # -- building --------------------------------------------------------------------------

    def _build(self, o: SessionOptions, links: _Links) -> None:
        """Make this session's parts, kernel, prompt and loop from *o*, tied by *links*."""
        self.session_id = o.session_id or uuid.uuid4().hex
        self.preset = o.preset
        self.parent_id = links.parent_id
        self.branch = links.branch
        self._parts = parts = self._make_parts(o, links)
        self.tracker = parts.wiring.tracker
        self._branch_runs = 0
        self._branches: list[AsyncSession] = []
        if links.kernel is None:
            values, types = bind_inputs(o.preset, o.inputs)
            values = parts.guard.redact_value(values)  # secrets never enter the kernel
        else:  # a fork's kernel holds them already, and its prompt is the parent's
            values, types = {}, {}
        user_functions = [as_host_function(f) for f in o.functions]
        if o.embeddings is not None:
            from sunroom.embeddings.functions import embedding_functions  # numpy: an extra

            user_functions += embedding_functions(
                o.embeddings, before_call=parts.wiring.count_embedding
            )
        submit_fn = parts.submission.function()
        every = [*user_functions, *parts.predictor.functions(), submit_fn]
        instrumented = [self._vetted(hf) for hf in every]
        self._kernel = self._kernel_for(o, links, values, instrumented)
        self.limits = self._kernel.limits
        prompt = parts.wiring.redact(
            system_prompt_for(
                preset=o.preset,
                tool=o.code_tool,
                functions=user_functions,
                variables=values,
                variable_types=types,
                submit_source=describe_functions([submit_fn]),
                output=o.output,
                max_output_chars=o.max_output_chars,
                extra=o.system_prompt,
                semantic_search=o.embeddings is not None,
                network=o.network,
            )
        )
        self._loop = Loop(
            LoopConfig(
                model=parts.model,
                kernel=self._kernel,
                gate=parts.gate,
                publish=parts.wiring.publish,
                guard=parts.guard,
                submission=parts.submission,
                hooks=o.hooks,
                max_turns=o.max_turns,
                max_output_chars=o.max_output_chars,
                tool=o.code_tool,
                needs_submit=o.output is not None or o.preset != "codeact",
                sub_session=links.depth > 0,
                reinstall=self._install_shim,
                live=parts.live,
                end_event=ev.SessionEnded if links.branch is None else ev.BranchEnded,
                agent=o.preset,
            ),
            system=prompt,
        )
        if links.kernel is not None:  # a fork: the parent's transcript (redacted, frozen)
            self._loop.messages[:] = o.transcript
        elif o.transcript:
            # a resumed session continues a recorded (already redacted) transcript
            self._loop.messages[:] = [parts.guard.redact_value(m) for m in o.transcript]
        self._task: asyncio.Task[RunResult] | None = None
        self._started = links.kernel is not None  # a forked kernel runs, its helpers in place
        self._closed = False

    def _make_parts(self, o: SessionOptions, links: _Links) -> _Parts:
        """The parts that never change: models, approvals, bus, guard, budget, wiring."""
        approvals = links.broker or Approvals(o.approvals, timeout_s=o.approval_timeout_s)
        owned: list[Model] = []
        model = _resolve(o.model, owned)
        sub_model = model if o.sub_model is None else _resolve(o.sub_model, owned)
        bus = EventBus(maxsize=o.event_buffer) if links.bus is None else links.bus
        secrets = o.secrets if isinstance(o.secrets, Secrets) else Secrets(o.secrets)
        guard = context_guard(secrets, o.context)
        tracker = links.tracker or BudgetTracker(o.budget, spent=o.spent)
        wiring = SessionWiring(
            session_id=self.session_id,
            branch=links.branch,
            depth=links.depth,
            guard=guard,
            bus=bus,
            tracker=tracker,
            approvals=approvals,
            approval_publish=links.approval_publish,
        )
        gate = ModelGate(tracker, wiring.publish)
        predictor = Predictor(
            model=sub_model,
            gate=gate,
            publish=wiring.publish,
            redact=wiring.redact,
            concurrency=o.predict_concurrency,
            nested=self._nested if links.depth + 1 < o.max_depth else None,
            tree=links.tree,
        )
        parts = _Parts(
            options=dataclasses.replace(o, secrets=secrets),
            model=model,
            sub_model=sub_model,
            owned=tuple(owned),
            approvals=approvals,
            owns_approvals=links.broker is None,
            bus=bus,
            owns_bus=links.bus is None,
            secrets=secrets,
            guard=guard,
            wiring=wiring,
            gate=gate,
            submission=Submission(output=o.output, publish=wiring.publish, redact=wiring.redact),
            predictor=predictor,
            live=LiveOutput(publish=wiring.publish, guard=guard),
            toolset=None,
            depth=links.depth,
        )
        if o.mcp and links.kernel is None:
            parts = dataclasses.replace(parts, toolset=self._toolset_for(o.mcp, parts))
        return parts

    def _vetted(self, hf: HostFunction, parts: _Parts | None = None) -> HostFunction:
        """*hf* with the session's approval gate, hooks, events and redaction around it."""
        p = parts or self._parts
        return instrument(
            dataclasses.replace(hf, gate=p.wiring.gate_for(hf), approval=None),  # decided here
            hooks=p.options.hooks,
            publish=p.wiring.publish,
            redact=p.wiring.redact,
            redact_value=p.guard.redact_value,
        )

    def _toolset_for(self, mcp: Iterable[McpServer] | Toolset, parts: _Parts) -> Toolset:
        """The session's MCP toolset: every tool call vetted like a host function's."""
        try:
            from sunroom.mcp.toolset import Toolset  # the mcp SDK is an optional extra
        except ModuleNotFoundError as exc:
            raise UsageError(
                f"mcp= needs the MCP SDK ({exc.name} is missing): pip install 'sunroom[mcp]'"
            ) from None

        def vetted(hf: HostFunction) -> HostFunction:
            return self._vetted(hf, parts)

        if isinstance(mcp, Toolset):  # e.g. the service's, its calls wrapped by the ledger
            return mcp.then(vetted)
        return Toolset(mcp, wrap=vetted)

    def _kernel_for(
        self,
        o: SessionOptions,
        links: _Links,
        values: Mapping[str, object],
        instrumented: list[HostFunction],
    ) -> AsyncKernel:
        """A new kernel for this session, or the fork's copy with this session's functions."""
        parts = self._parts
        if links.kernel is None:
            kernel = AsyncKernel(
                backend=o.backend,
                functions=instrumented,
                inputs=values,
                limits=o.limits,
                template=o.template,
                mcp=parts.toolset if parts.toolset is not None else (),
                network=o.network,
                on_connection=parts.wiring.connection if o.network is not None else None,
                packages=o.packages,
                on_output=parts.live.feed,
            )
            if kernel.network is not None:
                parts.wiring.meter_on(asyncio.get_running_loop())
                kernel.network.meter(parts.wiring.charge_network)
            return kernel
        # A forked kernel's copied registry serves the parent's submit, predict and events:
        # this session's own functions (the same names and signatures) take their place.
        # MCP tools stay the parent's (their events carry no branch id).
        kernel = links.kernel
        kernel.on_output = parts.live.feed
        tools = [hf for hf in kernel.registry.functions.values() if "." in hf.name]
        copied, kernel.registry = kernel.registry, FunctionRegistry([*instrumented, *tools])
        copied.close()
        return kernel

    async def _install_shim(self) -> None:
        with tracing.quiet():  # sunroom's own setup: no cell span, no trace of its own
            result = await self._kernel.execute(SHIM_SOURCE)
        if not result.ok:
            message = result.error.message if result.error else result.status
            raise KernelError(f"installing predict/submit in the kernel failed: {message}")

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
        tools = self._parts.toolset.describe() if self._parts.toolset is not None else ""
        if tools and isinstance(system, SystemMessage) and _MCP_HEADING not in system.text:
            self._loop.messages[0] = system = SystemMessage(
                f"{system.text}\n\n{_MCP_HEADING} (call them from your code; "
                "help(module.tool) shows the full description):\n"
                f"```python\n{self._parts.wiring.redact(tools)}\n```"
            )
        if isinstance(system, SystemMessage) and PACKAGES_HEADING not in system.text:
            line = await self._packages_line()
            if line:
                self._loop.messages[0] = SystemMessage(
                    f"{system.text}\n\n{self._parts.wiring.redact(line)}"
                )
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
        if self._parts.owns_approvals:
            self._parts.approvals.deny_all("the session closed while this call waited for approval")
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])  # the run never raises; our own cancel propagates
        try:
            for kid in self._branches:  # left only if the branched run was cancelled twice
                await kid.aclose()
            await self._kernel.aclose()
        finally:
            for owned in self._parts.owned:
                with contextlib.suppress(Exception):
                    await owned.aclose()
            if self._parts.owns_bus:  # a branch publishes on its parent's bus
                self._parts.bus.close()

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
        self._parts.submission.reset()
        if self._parts.owns_approvals:
            self._parts.approvals.new_run()  # leases hold for one run
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
            span = tracing.start_agent_span(  # the branched run's: the fork and every branch
                agent=self.preset,
                model=self._parts.model,
                conversation_id=self.session_id,
                links=self._kernel.trace_links,
            )
            try:
                with tracing.use(span):
                    kids = await self._fork_sessions(k)
            except BaseException:
                tracing.end(span)
                raise
            self._task = asyncio.get_running_loop().create_task(
                self._branched(task, kids, choose, label, span),
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
        self._parts.approvals.answer(call_id, allow=allow, reason=reason, lease=lease)

    def pending_approvals(self) -> tuple[ApprovalRequest, ...]:
        """The host calls waiting for an answer now, oldest first."""
        return self._parts.approvals.pending()

    def interrupt(self, reason: str) -> None:
        """Steer the running run: *reason* reaches the model before its next call."""
        if self.running:
            self._steer(self._parts.wiring.redact(reason), interrupt=True)

    def cancel(self) -> None:
        """Cancel the running run (its result becomes ``cancelled``); no-op when idle."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def events(self, *, maxsize: int | None = None) -> Subscription:
        """Subscribe to every event published from now on (``async for e in s.events()``).

        The iteration ends when the session closes. A subscriber more than *maxsize* routine
        events behind loses routine ones (counted in ``dropped``), never control events.
        """
        return self._parts.bus.subscribe(maxsize=maxsize)

    @property
    def messages(self) -> tuple[Message, ...]:
        """The transcript as the model sees it (redacted)."""
        return tuple(self._loop.messages)

    # -- forks and branched runs -----------------------------------------------------------

    async def fork(self) -> AsyncSession:
        """A new session that continues from this one's current state.

        The fork has a copy of the transcript, a fork of the kernel (its variables, imports and
        bound inputs: :meth:`AsyncKernel.fork`, docs/fork.md), the same options (model,
        preset, output, functions, hooks, secrets, limits) and **this session's budget
        tracker**: what either spends counts against the one budget. It has a new
        ``session_id``, ``parent_id`` set to this session's id, and its own events; it starts
        idle and ready. Close it yourself: closing either session does not close the other.
        Models given as strings are built again for the fork (it owns and closes its own).

        Raises UsageError while a run is in progress (await ``result()`` first) and on a
        backend that cannot fork (a custom one); ForkError when the kernel refuses (threads its
        code left running); KernelStartError when the copy does not come up; ClosedError
        after close.
        """
        (kid,) = await self._fork_sessions(1, branched=False)
        return kid

    async def _fork_sessions(self, n: int, *, branched: bool = True) -> list[AsyncSession]:
        """*n* forks of this idle session; branches publish on this session's bus."""
        if self._closed:
            raise ClosedError("the session is closed")
        if self.running:
            raise UsageError("cannot fork while a run is in progress; await result() first")
        await self.start()
        kernels = await self._kernel.fork(n)
        if branched:
            self._branch_runs += 1
        p = self._parts
        kids: list[AsyncSession] = []
        try:
            for i, kernel in enumerate(kernels):
                options = p.options
                branch = None
                if branched:  # branches share the models (they never outlive this session)
                    options = dataclasses.replace(options, model=p.model, sub_model=p.sub_model)
                    branch = f"{self._branch_runs}.{i}"
                kid = AsyncSession.__new__(AsyncSession)
                kid._build(
                    dataclasses.replace(
                        options,
                        session_id=None if branch is None else f"{self.session_id}/{branch}",
                        transcript=self.messages,
                        budget=None,
                        spent=None,
                        template=None,
                        mcp=(),
                    ),
                    _Links(
                        tracker=self.tracker,
                        depth=p.depth,
                        kernel=kernel,
                        bus=p.bus if branched else None,
                        broker=p.approvals if branched else None,
                        branch=branch,
                        parent_id=self.session_id,
                    ),
                )
                kids.append(kid)
        except BaseException:
            for kid in kids:
                await kid.aclose()
            for kernel in kernels[len(kids) :]:
                await kernel.aclose()
            raise
        return kids

    async def _branched(
        self, task: str, kids: list[AsyncSession], choose: Choose, label: str, span: Span | None
    ) -> RunResult:
        """The task of a branched run (:func:`~sunroom.agent.branches.run_branches`).

        *span* is the run's ``invoke_agent`` span (:mod:`sunroom.tracing`), ended here: the
        branches' runs are its children.
        """
        try:
            with tracing.use(span):
                result = await br.run_branches(
                    task,
                    kids,
                    choose,
                    label,
                    session_id=self.session_id,
                    tracker=self.tracker,
                    publish=self._parts.wiring.publish,
                    redact=self._parts.wiring.redact,
                    adopt=self._adopt,
                    live=self._branches,
                )
            tracing.record_run(
                span,
                status=result.status,
                turns=result.turns,
                input_tokens=result.usage.input_tokens,
                output_tokens=result.usage.output_tokens,
            )
        finally:
            tracing.end(span)
        return result

    def _steer(self, text: str, *, interrupt: bool) -> None:
        """Queue *text* (already redacted) for the running run, or for each running branch."""
        live = [kid for kid in self._branches if kid.running]
        if not live:
            self._loop.steer(text, interrupt=interrupt)
        for kid in live:
            kid._loop.steer(text, interrupt=interrupt)

    def _adopt(self, winner: AsyncSession) -> None:
        """Continue from *winner*: take its transcript and kernel, and give it the former one.

        Closing the winner then closes the former kernel. Host functions stay each session's
        own: the kernels swap registries too.
        """
        mine, theirs = self._kernel, winner._kernel
        mine.registry, theirs.registry = theirs.registry, mine.registry
        mine.on_output, theirs.on_output = theirs.on_output, mine.on_output
        self._kernel, winner._kernel = theirs, mine
        self._loop.c = dataclasses.replace(self._loop.c, kernel=theirs)
        winner._loop.c = dataclasses.replace(winner._loop.c, kernel=mine)
        self._loop.messages[:] = winner._loop.messages
        mine_sub, theirs_sub = self._parts.submission, winner._parts.submission
        mine_sub.accepted = theirs_sub.accepted
        mine_sub.value = theirs_sub.value

    # -- nested sessions -------------------------------------------------------------------

    async def _nested(
        self, instructions: str, value: object, output: OutputSpec, tree: TreeLink
    ) -> object:
        """Run a nested ``rlm`` session on *value* (``predict(recursive=True)``); its output.

        It runs on the sub-model, one level deeper, with this session's budget tracker,
        approvals and kernel options; not its MCP servers or template. Raises AgentError when
        it does not succeed.
        """
        p = self._parts
        o = p.options
        options = SessionOptions(
            model=p.sub_model,
            preset="rlm",
            backend=o.backend,
            limits=o.limits,
            inputs={"input": value},
            output=output,
            max_turns=o.max_turns,
            max_output_chars=o.max_output_chars,
            secrets=p.secrets,
            hooks=o.hooks,
            context=o.context,
            max_depth=o.max_depth,
            predict_concurrency=o.predict_concurrency,
            code_tool=o.code_tool,
            embeddings=o.embeddings,
            network=o.network,
            packages=o.packages,
        )
        sub = AsyncSession.__new__(AsyncSession)
        sub._build(
            options,
            _Links(
                tracker=self.tracker,
                depth=p.depth + 1,
                broker=p.approvals,
                approval_publish=p.wiring.approval_publish,
                tree=tree,
            ),
        )
        async with sub:
            result = await sub.run(instructions)
        if not result.ok:
            raise AgentError(f"the nested session ended with {result.status}: {result.error}")
        return result.output


def _resolve(spec: Model | str, owned: list[Model]) -> Model:
    """*spec* as a model; one built from a string is added to *owned* (the session closes it)."""
    if isinstance(spec, Model):
        return spec
    if isinstance(spec, str):
        built = build_model(spec)
        owned.append(built)
        return built
    raise UsageError(f"model must be a sunroom Model or a 'provider:name' string, got {spec!r}")
