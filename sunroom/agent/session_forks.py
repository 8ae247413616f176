"""Forks and branched runs: :meth:`fork`, ``run(branches=k)`` and adopting the chosen branch.

A fork is a session built from this one's options around a fork of its kernel
(:meth:`~sunroom.sandbox.kernel.AsyncKernel.fork`), with a copy of the transcript and the same
budget tracker. A branched run forks *k* branches that publish on this session's bus, runs the
task in each, picks one (:mod:`sunroom.agent.branches`) and continues from it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from sunroom.agent import branches as br
from sunroom.agent import events as ev
from sunroom.agent.branches import Choose
from sunroom.agent.result import RunResult, Status
from sunroom.agent.session_setup import SessionSetup
from sunroom.errors import ClosedError, UsageError

if TYPE_CHECKING:
    from sunroom.agent.session import AsyncSession

log = logging.getLogger("sunroom.agent")


class SessionForks(SessionSetup):
    """Forks a session; runs the branches of a branched run and adopts the winner."""

    if TYPE_CHECKING:  # provided by AsyncSession

        @property
        def running(self) -> bool:
            """Whether a run is in progress."""

        @property
        def messages(self) -> tuple[Any, ...]:
            """The transcript as the model sees it (redacted)."""

        async def start(self) -> None:
            """Start the kernel and install predict/submit helpers (idempotent)."""

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
        from sunroom.agent.session import AsyncSession  # the class this part belongs to

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
