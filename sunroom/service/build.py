"""Building an agent session from its request: :class:`SessionBuilder`.

A request (:class:`~sunroom.service.schemas.CreateSession`, as sent or as recorded in the
session's config) becomes a :class:`~sunroom.service.live.Live` that is not started yet: an
:class:`~sunroom.agent.session.AsyncSession` on the backend, limits, network, template and MCP
servers the request names (within what the server's config allows), whose every event goes to
a :class:`~sunroom.service.journal.Journal`, whose host and MCP calls a
:class:`~sunroom.service.journal.CallLedger` records before they run, and whose cells wait
until the reply that asked for them is durable. Building touches neither the store nor a
kernel, so a request that cannot work fails here, before anything is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sunroom.agent.budget import Spend
from sunroom.agent.hooks import Hooks, Veto
from sunroom.agent.options import SessionOptions
from sunroom.agent.session import AsyncSession
from sunroom.errors import UsageError
from sunroom.providers import Message, Model
from sunroom.sandbox.backends.choice import describe_backend
from sunroom.sandbox.functions import HostFunction
from sunroom.service.config import ServiceConfig
from sunroom.service.file_inputs import bound_files
from sunroom.service.journal import CallLedger, Journal
from sunroom.service.live import Live, ModelResolver
from sunroom.service.probes import NO_PROBE, Probe
from sunroom.service.schemas import CreateSession, network_spec, output_type
from sunroom.service.templates import Templates
from sunroom.store import EventStore

__all__ = ["SessionBuilder", "close_model"]

log = logging.getLogger("sunroom.service")


@dataclass(frozen=True, slots=True)
class SessionBuilder:
    """Builds the sessions of one :class:`~sunroom.service.sessions.SessionManager`.

    Args:
        store: where each session's journal and call ledger write.
        owner: the manager's owner string (every write is made as this owner).
        config: the server's defaults and what it allows (backends, networks, MCP servers).
        templates: the kernel templates a request may name.
        resolve: builds a session's model from its ``model``/``base_url``.
        functions: host functions offered to every session (their calls are recorded).
        notify: told a session's id when it has new events.
        on_ended: awaited when a run of a session ended (its ``SessionEnded`` is durable).
        on_failed: told when a session's journal failed (its ownership was lost).
        probe: told each session's events (the service's metrics).
    """

    store: EventStore
    owner: str
    config: ServiceConfig
    templates: Templates
    resolve: ModelResolver
    functions: tuple[HostFunction, ...]
    notify: Callable[[str], None]
    on_ended: Callable[[Live, dict[str, object]], Awaitable[None]]
    on_failed: Callable[[str, BaseException], None]
    probe: Probe = NO_PROBE

    async def build(
        self,
        sid: str,
        request: CreateSession,
        *,
        next_seq: int,
        first_call: int,
        transcript: list[Message] | None,
        spent: Spend | None = None,
        generation: int | None = None,
    ) -> Live:
        """The session *sid* asks for, not started: touches neither the store nor a kernel.

        *generation* is the lease's fencing generation its writes name (see the store seam).

        Raises UsageError (unknown provider or backend, bad limits, budget or schema) and
        AuthenticationError (no API key), after which nothing is left to close.
        """
        assert request.model is not None
        backend = self.config.kernel_backend(
            request.backend, kernel_name=request.kernel_name, sandbox=request.sandbox
        )
        limits = request.limits.build() if request.limits else None
        network = self.config.network(network_spec(request.network))
        template = None
        if request.template is not None:
            if limits is not None:
                raise UsageError("a session from a template runs with its limits; omit limits")
            if request.kernel_name is not None or request.sandbox is not None:
                raise UsageError(
                    "a session from a template runs on its backend; omit kernel_name and sandbox"
                )
            template = await self.templates.get(request.template)
        budget = request.budget.build() if request.budget else None
        output = output_type(request.output_schema)
        holder: list[Live] = []
        journal = Journal(
            self.store,
            sid,
            owner=self.owner,
            generation=generation,
            next_seq=next_seq,
            notify=lambda: self.notify(sid),
            on_ended=lambda result: self.on_ended(holder[0], result),
            on_failed=lambda exc: self.on_failed(sid, exc),
        )
        runs_on = template.backend if template is not None else backend
        journal.observe = self.probe.session_observer(
            journal, backend=describe_backend(runs_on)["backend"] or "", model=request.model,
            spent=spent,
        )  # fmt: skip

        async def checkpoint(code: str) -> Veto | None:
            await journal.flush()  # the reply asking for this cell is durable before it runs
            return None

        ledger = CallLedger(
            self.store, sid, owner=self.owner, generation=generation, first_call=first_call
        )
        servers = self.config.mcp(request.mcp)
        toolset = None
        if servers:
            from sunroom.mcp.toolset import Toolset

            toolset = Toolset(servers, wrap=ledger.wrap)  # MCP calls are recorded like any
        model = self.resolve(request.model, request.base_url)
        try:
            options = SessionOptions(
                model=model,
                preset=request.preset,
                backend=backend,
                limits=limits,
                functions=[ledger.wrap(f) for f in self.functions],
                inputs={**request.inputs, **bound_files(request.files)} or None,
                output=output,
                budget=budget,
                max_turns=request.max_turns,
                max_depth=request.max_depth,
                system_prompt=request.system_prompt,
                code_tool=request.code_mode == "tool",
                hooks=Hooks(before_execute=checkpoint),
                session_id=sid,
                transcript=transcript or (),
                spent=spent,
                template=template,
                mcp=toolset if toolset is not None else (),
                approvals=request.approvals,
                approval_timeout_s=request.approval_timeout_s,
                network=network,
            )
            session = AsyncSession.from_options(options)
        except BaseException:
            await close_model(sid, model)
            raise
        live = Live(sid=sid, session=session, journal=journal, model=model)
        holder.append(live)
        return live


async def close_model(sid: str, model: Model) -> None:
    """Close session *sid*'s *model*; a failure is logged, not raised (the session is gone)."""
    try:
        await model.aclose()
    except Exception:
        log.exception("session %s: closing its model failed", sid)
