"""Agent sessions: :class:`AsyncSession`, the async core (``Session`` is its sync twin).

A session owns one kernel, a transcript, an event bus and a budget tracker. Each run (``run``,
or ``send`` when idle) loops: model turn → cells the reply asked for → output back to the
model, until a terminal :class:`~sunroom.agent.result.RunResult`. The loop itself is in
:mod:`sunroom.agent.loop`; this module wires the parts together and holds the public surface.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeAlias, final

import pydantic

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
from sunroom.agent.loop import Loop, LoopConfig
from sunroom.agent.predict import Predictor
from sunroom.agent.presets import PRESETS, Preset, bind_inputs
from sunroom.agent.prompts import describe_functions, system_prompt
from sunroom.agent.redaction import Secrets
from sunroom.agent.result import RunResult, Status
from sunroom.agent.schema import JsonSchema
from sunroom.agent.shim import SHIM_SOURCE
from sunroom.agent.submit import Submission, type_name
from sunroom.errors import AgentError, BudgetExceededError, ClosedError, KernelError, UsageError
from sunroom.providers import Message, Model, SystemMessage
from sunroom.providers import model as build_model
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.functions import FunctionRegistry, Gate, HostFunction, as_host_function
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits
from sunroom.sandbox.packages import PACKAGES_HEADING, notable_line

_MCP_HEADING = "MCP tools, one module per server"


if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from sunroom.embeddings.functions import Embedder
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.network.proxy import Connection
    from sunroom.sandbox.packages import Packages
    from sunroom.sandbox.template import Template

__all__ = ["AsyncSession", "Inputs", "OutputSpec", "system_prompt_for"]

log = logging.getLogger("sunroom.agent")

Inputs: TypeAlias = "Mapping[str, object] | pydantic.BaseModel | DataclassInstance | None"
"""Variables to bind: a mapping of names to values (``typed``: also a model/dataclass instance)."""

OutputSpec: TypeAlias = (
    "type[object] | types.UnionType | types.GenericAlias | JsonSchema | Mapping[str, object] | None"
)
"""What ``submit`` must satisfy: a pydantic model, a dataclass, any type pydantic validates, or a
JSON Schema (a mapping, or a checked :class:`~sunroom.agent.schema.JsonSchema`)."""


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

    @classmethod
    def _nested_session(cls, *, tracker: BudgetTracker, depth: int, **options: Any) -> Self:
        """A sub-session for ``predict(recursive=True)``: shares *tracker*, one level deeper."""
        self = cls.__new__(cls)
        self._setup(**options, tracker=tracker, depth=depth)
        return self

    def _setup(
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
        broker: Approvals | None = None,
        approval_publish: Publish | None = None,
        tracker: BudgetTracker | None,
        depth: int,
        kernel: AsyncKernel | None = None,
        bus: EventBus | None = None,
        branch: str | None = None,
        parent_id: str | None = None,
    ) -> None:
        if preset not in PRESETS:
            raise UsageError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        for name, value in (("max_turns", max_turns), ("max_output_chars", max_output_chars)):
            if not isinstance(value, int) or value <= 0:
                raise UsageError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(max_depth, int) or max_depth < 1:
            raise UsageError(f"max_depth must be an int >= 1, got {max_depth!r}")
        if hooks is not None and not isinstance(hooks, Hooks):
            raise UsageError("hooks must be a sunroom.agent.Hooks")
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise UsageError("session_id must be a non-empty str")
        functions = tuple(functions)
        self._owns_approvals = broker is None
        self._approvals = broker or Approvals(approvals, timeout_s=approval_timeout_s)
        self.session_id = session_id or uuid.uuid4().hex
        self.preset = preset
        self.parent_id = parent_id
        self.branch = branch
        self._owned: list[Model] = []
        self._model = self._resolve(model)
        self._sub_model = self._model if sub_model is None else self._resolve(sub_model)
        self._owns_bus = bus is None
        self._bus = EventBus(maxsize=event_buffer) if bus is None else bus
        self._secrets = secrets if isinstance(secrets, Secrets) else Secrets(secrets)
        # what a fork is built from (it gets the parent's transcript, tracker and kernel copy)
        self._spec: dict[str, Any] = {
            "model": model,
            "preset": preset,
            "sub_model": sub_model,
            "backend": backend,
            "limits": limits,
            "functions": functions,
            "inputs": inputs,
            "output": output,
            "max_turns": max_turns,
            "max_output_chars": max_output_chars,
            "secrets": self._secrets,
            "hooks": hooks,
            "context": context,
            "system_prompt": system_prompt,
            "max_depth": max_depth,
            "predict_concurrency": predict_concurrency,
            "code_tool": code_tool,
            "event_buffer": event_buffer,
            "approvals": approvals,
            "approval_timeout_s": approval_timeout_s,
            "embeddings": embeddings,
            "network": network,
            "packages": packages,
        }
        self._branch_runs = 0
        self._branches: list[AsyncSession] = []
        self._guard: Guard = context_guard(self._secrets, context)
        self.tracker = tracker or BudgetTracker(budget, spent=spent)
        self._gate = ModelGate(self.tracker, self._publish)
        # a nested session's approval requests go to its root's events (where they are answered)
        self._approval_publish: Publish = approval_publish or self._publish
        self._depth = depth
        self._options: dict[str, Any] = {
            "backend": backend,
            "limits": limits,
            "max_turns": max_turns,
            "max_output_chars": max_output_chars,
            "hooks": hooks,
            "context": context,
            "max_depth": max_depth,
            "predict_concurrency": predict_concurrency,
            "code_tool": code_tool,
            "broker": self._approvals,
            "approval_publish": self._approval_publish,
            "embeddings": embeddings,
            "network": network,
            "packages": packages,
        }
        self._submission = Submission(output=output, publish=self._publish, redact=self._redact)
        self._predictor = Predictor(
            model=self._sub_model,
            gate=self._gate,
            publish=self._publish,
            redact=self._redact,
            concurrency=predict_concurrency,
            nested=self._nested if depth + 1 < max_depth else None,
        )
        if kernel is None:
            values, types = bind_inputs(preset, inputs)
            values = self._guard.redact_value(values)  # secrets never enter the kernel
        else:  # a fork's kernel holds them already, and its prompt is the parent's
            values, types = {}, {}
        user_functions = [as_host_function(f) for f in functions]
        if embeddings is not None:
            from sunroom.embeddings.functions import embedding_functions  # numpy: an extra

            user_functions += embedding_functions(embeddings, before_call=self._count_embedding)
        submit_fn = self._submission.function()
        every = [*user_functions, *self._predictor.functions(), submit_fn]
        instrumented = [
            instrument(
                dataclasses.replace(hf, gate=self._gate_for(hf), approval=None),  # decided here
                hooks=hooks,
                publish=self._publish,
                redact=self._redact,
                redact_value=self._guard.redact_value,
            )
            for hf in every
        ]
        self._toolset: Toolset | None = None
        if mcp and kernel is None:
            try:
                from sunroom.mcp.toolset import Toolset  # the mcp SDK is an optional extra
            except ModuleNotFoundError as exc:
                raise UsageError(
                    f"mcp= needs the MCP SDK ({exc.name} is missing): pip install 'sunroom[mcp]'"
                ) from None

            def vetted(hf: HostFunction) -> HostFunction:
                return instrument(
                    dataclasses.replace(hf, gate=self._gate_for(hf), approval=None),
                    hooks=hooks,
                    publish=self._publish,
                    redact=self._redact,
                    redact_value=self._guard.redact_value,
                )

            if isinstance(mcp, Toolset):  # e.g. the service's, its calls wrapped by the ledger
                self._toolset = mcp.then(vetted)
            else:
                self._toolset = Toolset(mcp, wrap=vetted)
        if kernel is None:
            self._kernel = AsyncKernel(
                backend=backend,
                functions=instrumented,
                inputs=values,
                limits=limits,
                template=template,
                mcp=self._toolset if self._toolset is not None else (),
                network=network,
                on_connection=self._connection if network is not None else None,
                packages=packages,
            )
            if self._kernel.network is not None:
                self._kernel.network.meter(self._charge_network)
        else:
            # A forked kernel's copied registry serves the parent's submit, predict and events:
            # this session's own functions (the same names and signatures) take their place.
            # MCP tools stay the parent's (their events carry no branch id).
            tools = [hf for hf in kernel.registry.functions.values() if "." in hf.name]
            copied, kernel.registry = kernel.registry, FunctionRegistry([*instrumented, *tools])
            copied.close()
            self._kernel = kernel
        self.limits = self._kernel.limits
        prompt = self._redact(
            system_prompt_for(
                preset=preset,
                tool=code_tool,
                functions=user_functions,
                variables=values,
                variable_types=types,
                submit_source=describe_functions([submit_fn]),
                output=output,
                max_output_chars=max_output_chars,
                extra=system_prompt,
                semantic_search=embeddings is not None,
                network=network,
            )
        )
        self._loop = Loop(
            LoopConfig(
                model=self._model,
                kernel=self._kernel,
                gate=self._gate,
                publish=self._publish,
                guard=self._guard,
                submission=self._submission,
                hooks=hooks,
                max_turns=max_turns,
                max_output_chars=max_output_chars,
                tool=code_tool,
                needs_submit=output is not None or preset != "codeact",
                sub_session=depth > 0,
                reinstall=self._install_shim,
                end_event=ev.SessionEnded if branch is None else ev.BranchEnded,
            ),
            system=prompt,
        )
        if kernel is not None:  # a fork: the parent's transcript (redacted, frozen messages)
            self._loop.messages[:] = transcript
        elif transcript:
            # a resumed session continues a recorded (already redacted) transcript
            self._loop.messages[:] = [self._guard.redact_value(m) for m in transcript]
        self._task: asyncio.Task[RunResult] | None = None
        self._started = kernel is not None  # a forked kernel is running, its helpers in place
        self._closed = False

    def _resolve(self, spec: Model | str) -> Model:
        if isinstance(spec, Model):
            return spec
        if isinstance(spec, str):
            built = build_model(spec)
            self._owned.append(built)
            return built
        raise UsageError(f"model must be a sunroom Model or a 'provider:name' string, got {spec!r}")

    def _redact(self, text: str) -> str:
        return self._guard.redact(text)

    def _count_embedding(self, name: str) -> None:
        """Count one ``embed``/``search`` call against the budget (a BudgetWarning if spent)."""
        try:
            self.tracker.count_embedding_call()
        except BudgetExceededError as exc:
            self._publish(ev.BudgetWarning, limit=exc.limit, message=str(exc))
            raise

    def _connection(self, c: Connection) -> None:
        """Publish one connection of the kernel's egress proxy (no header, no body)."""
        self._publish(
            ev.NetworkConnection,
            host=c.host,
            port=c.port,
            scheme=c.scheme,
            allowed=c.allowed,
            reason=c.reason,
            bytes_sent=c.bytes_sent,
            bytes_received=c.bytes_received,
            duration_s=c.duration_s,
        )

    def _charge_network(self, size: int) -> bool:
        """Count bytes through the proxy against the budget (a BudgetWarning once spent)."""
        if self.tracker.charge_network(size):
            return True
        if self.tracker.exceeded is None:
            try:
                self.tracker.check()
            except BudgetExceededError as exc:
                self._publish(ev.BudgetWarning, limit=exc.limit, message=str(exc))
        return False

    def _gate_for(self, hf: HostFunction) -> Gate | None:
        return self._approvals.gate(
            hf,
            session_id=self.session_id,
            depth=self._depth,
            publish=self._approval_publish,
            redact=self._redact,
            redact_value=self._guard.redact_value,
        )

    def _publish(self, cls: type[ev.Event], /, **fields: Any) -> ev.Event:
        clean = {k: self._guard.redact_value(v) for k, v in fields.items()}
        if self.branch is not None:
            clean["branch"] = self.branch
        return self._bus.publish(cls, **clean)

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

    async def _install_shim(self) -> None:
        result = await self._kernel.execute(SHIM_SOURCE)
        if not result.ok:
            message = result.error.message if result.error else result.status
            raise KernelError(f"installing predict/submit in the kernel failed: {message}")

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

    # -- forks and branches ----------------------------------------------------------------

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
        kids: list[AsyncSession] = []
        try:
            for i, kernel in enumerate(kernels):
                spec = dict(self._spec)
                branch = None
                if branched:  # branches share the models (they never outlive this session)
                    spec["model"], spec["sub_model"] = self._model, self._sub_model
                    branch = f"{self._branch_runs}.{i}"
                kid = AsyncSession.__new__(AsyncSession)
                kid._setup(
                    **spec,
                    session_id=None if branch is None else f"{self.session_id}/{branch}",
                    transcript=self.messages,
                    tracker=self.tracker,
                    depth=self._depth,
                    kernel=kernel,
                    bus=self._bus if branched else None,
                    broker=self._approvals if branched else None,
                    branch=branch,
                    parent_id=self.session_id,
                )
                kids.append(kid)
        except BaseException:
            for kid in kids:
                await kid.aclose()
            for kernel in kernels[len(kids) :]:
                await kernel.aclose()
            raise
        return kids

    def _steer(self, text: str, *, interrupt: bool) -> None:
        """Queue *text* (already redacted) for the running run, or for each running branch."""
        live = [kid for kid in self._branches if kid.running]
        if not live:
            self._loop.steer(text, interrupt=interrupt)
        for kid in live:
            kid._loop.steer(text, interrupt=interrupt)

    async def _branched(
        self, task: str, kids: list[AsyncSession], choose: Choose, label: str
    ) -> RunResult:
        """The task of a branched run: run the branches, pick one, adopt it. Never raises."""
        start = self.tracker.snapshot()
        self._branches = kids
        self._publish(ev.BranchesStarted, branches=tuple(str(k.branch) for k in kids), choose=label)
        runs = {
            asyncio.get_running_loop().create_task(kid.run(task), name=f"sunroom-branch-{i}"): i
            for i, kid in enumerate(kids)
        }
        results: dict[int, RunResult] = {}
        order: list[int] = []  # branch indices as they finished
        chosen: int | None = None
        reason = "no branch succeeded"
        failure: tuple[Status, str] | None = None  # (status, error) of a run that ends otherwise
        asking = False
        try:
            pending = set(runs)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in sorted(done, key=runs.__getitem__):
                    results[runs[t]] = t.result()
                    order.append(runs[t])
                if choose == "first":
                    chosen = next((i for i in order if results[i].ok), None)
                    if chosen is not None:
                        reason = "the first branch to succeed"
                        break
            if choose == "vote":
                chosen, reason = br.vote(results, order)
            elif callable(choose):
                asking = True
                chosen = await br.ask(choose, [results[i] for i in range(len(kids))])
                reason = f"chosen by {label}" if chosen is not None else f"{label} chose none"
        except asyncio.CancelledError:
            failure = ("cancelled", "the run was cancelled")
        except Exception as exc:  # a bug in the chooser (as in a hook), or in sunroom
            log.exception("session %s: the branched run failed", self.session_id)
            what = "choose failed" if asking else "internal error"
            failure = ("internal_error", f"{what}: {type(exc).__name__}: {exc}")
        if failure is not None:
            chosen, reason = None, failure[1]
        # losers first: their runs end (cancelled, if still going) and their kernels die
        for i, kid in enumerate(kids):
            if i != chosen:
                await kid.aclose()
        for t, i in runs.items():
            if i not in results:
                results[i] = await t
        self._branches = []
        winner = None if chosen is None else kids[chosen]
        self._publish(
            ev.BranchChosen, chosen=None if winner is None else winner.branch, reason=reason
        )
        if winner is not None:
            self._adopt(winner)
            await winner.aclose()  # it holds this session's former kernel now
        spend = self.tracker.snapshot().since(start)
        status: Status
        error: str | None
        if failure is not None:
            status, error, output, turns = failure[0], failure[1], None, 0
        elif chosen is not None:
            won = results[chosen]
            status, error, output, turns = won.status, won.error, won.output, won.turns
        elif callable(choose) and results:
            status, error, output, turns = "rejected", f"{label} turned every branch down", None, 0
        else:
            status, error = br.no_winner([results[i] for i in sorted(results)])
            output, turns = None, 0
        result = RunResult(
            status=status,
            output=output,
            usage=spend.usage,
            cost_micro_usd=spend.cost_micro_usd if spend.cost_known else None,
            turns=turns,
            model_calls=spend.model_calls,
            sub_calls=spend.sub_calls,
            session_id=self.session_id,
            error=None if error is None else self._redact(error),
        )
        self._publish(ev.SessionEnded, result=result)
        return result

    def _adopt(self, winner: AsyncSession) -> None:
        """Continue from *winner*: take its transcript and kernel, and give it the former one.

        Closing the winner then closes the former kernel. Host functions stay each session's
        own: the kernels swap registries too.
        """
        mine, theirs = self._kernel, winner._kernel
        mine.registry, theirs.registry = theirs.registry, mine.registry
        self._kernel, winner._kernel = theirs, mine
        self._loop.c = dataclasses.replace(self._loop.c, kernel=theirs)
        winner._loop.c = dataclasses.replace(winner._loop.c, kernel=mine)
        self._loop.messages[:] = winner._loop.messages
        self._submission.accepted = winner._submission.accepted
        self._submission.value = winner._submission.value

    # -- approvals -------------------------------------------------------------------------

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

    async def _nested(self, instructions: str, value: Any, output: Any) -> Any:
        o = self._options
        async with AsyncSession._nested_session(
            tracker=self.tracker,
            depth=self._depth + 1,
            model=self._sub_model,
            preset="rlm",
            backend=o["backend"],
            limits=o["limits"],
            inputs={"input": value},
            output=output,
            max_turns=o["max_turns"],
            max_output_chars=o["max_output_chars"],
            secrets=self._secrets,
            hooks=o["hooks"],
            context=o["context"],
            max_depth=o["max_depth"],
            predict_concurrency=o["predict_concurrency"],
            code_tool=o["code_tool"],
            broker=o["broker"],
            approval_publish=o["approval_publish"],
            embeddings=o["embeddings"],
        ) as sub:
            result = await sub.run(instructions)
        if not result.ok:
            raise AgentError(f"the nested session ended with {result.status}: {result.error}")
        return result.output


def system_prompt_for(
    *,
    preset: str,
    tool: bool,
    functions: list[HostFunction],
    variables: Mapping[str, Any],
    variable_types: Mapping[str, str],
    submit_source: str,
    output: Any,
    max_output_chars: int,
    extra: str | None,
    semantic_search: bool = False,
    network: Network | None = None,
) -> str:
    """The generated system prompt of a session (see :mod:`sunroom.agent.prompts`)."""
    return system_prompt(
        preset=preset,
        tool=tool,
        functions=functions,
        variables=variables,
        variable_types=variable_types,
        submit_source=submit_source,
        output_name=None if output is None else type_name(output),
        max_output_chars=max_output_chars,
        extra=extra,
        semantic_search=semantic_search,
        network_hosts=None if network is None else list(network.allow),
    )
