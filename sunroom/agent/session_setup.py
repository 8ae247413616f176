"""Building a session: its options checked and its parts made (``AsyncSession._setup``).

:class:`SessionSetup` makes the parts a session is: the approvals broker, the models, the event
bus, the budget tracker, the submission and the predictor, the instrumented host functions
(hooks, events, redaction, approvals), the MCP toolset, the kernel (or a fork's copy), the
system prompt and the loop. A root session, a nested one (``predict(recursive=True)``), a fork
and a branch are all built here, with different arguments.
"""

from __future__ import annotations

import asyncio
import dataclasses
import types
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, TypeAlias

import pydantic

from sunroom.agent import events as ev
from sunroom.agent.approvals import DEFAULT_TIMEOUT_S, Approvals, Policy
from sunroom.agent.budget import Budget, BudgetTracker, Spend
from sunroom.agent.bus import EventBus
from sunroom.agent.calls import ModelGate, Publish, instrument
from sunroom.agent.context import ContextPolicy
from sunroom.agent.guard import Guard, context_guard
from sunroom.agent.hooks import Hooks
from sunroom.agent.loop import Loop, LoopConfig
from sunroom.agent.predict import Predictor
from sunroom.agent.presets import PRESETS, Preset, bind_inputs
from sunroom.agent.prompts import describe_functions, system_prompt_for
from sunroom.agent.redaction import Secrets
from sunroom.agent.result import RunResult
from sunroom.agent.schema import JsonSchema
from sunroom.agent.session_wiring import SessionWiring
from sunroom.agent.submit import Submission
from sunroom.errors import AgentError, UsageError
from sunroom.providers import Message, Model
from sunroom.providers import model as build_model
from sunroom.sandbox import backends
from sunroom.sandbox.backend import Backend
from sunroom.sandbox.functions import FunctionRegistry, HostFunction, as_host_function
from sunroom.sandbox.kernel import AsyncKernel
from sunroom.sandbox.limits import Limits

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from sunroom.agent.session import AsyncSession
    from sunroom.embeddings.functions import Embedder
    from sunroom.mcp.servers import McpServer
    from sunroom.mcp.toolset import Toolset
    from sunroom.network.policy import Network
    from sunroom.sandbox.packages import Packages
    from sunroom.sandbox.template import Template

Inputs: TypeAlias = "Mapping[str, object] | pydantic.BaseModel | DataclassInstance | None"
"""Variables to bind: a mapping of names to values (``typed``: also a model/dataclass instance)."""

OutputSpec: TypeAlias = (
    "type[object] | types.UnionType | types.GenericAlias | JsonSchema | Mapping[str, object] | None"
)
"""What ``submit`` must satisfy: a pydantic model, a dataclass, any type pydantic validates, or a
JSON Schema (a mapping, or a checked :class:`~sunroom.agent.schema.JsonSchema`)."""


class SessionSetup(SessionWiring):
    """Checks a session's options and builds its parts; builds nested sessions."""

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
                self._network_loop = asyncio.get_running_loop()
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

    async def _nested(self, instructions: str, value: Any, output: Any) -> Any:
        from sunroom.agent.session import AsyncSession  # the class this part belongs to

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
            network=o["network"],
            packages=o["packages"],
        ) as sub:
            result = await sub.run(instructions)
        if not result.ok:
            raise AgentError(f"the nested session ended with {result.status}: {result.error}")
        return result.output
