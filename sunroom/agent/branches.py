"""Picking the answer of a branched run: ``run(task, branches=k, choose=...)``.

A branched run forks the session into k branches that run the same task concurrently; this
module holds the rules that pick one of them, and :func:`run_branches`, which runs the forked
branches, picks one and hands it to the session to adopt (the session does the forking):

* ``"first"``: the first branch to finish with ``success`` wins, and the others are closed at
  once;
* ``"vote"``: every branch finishes; successful outputs are grouped by their canonical JSON
  (keys sorted), the largest group wins, a tie goes to the group whose first member finished
  first, and the winner is that group's first finisher;
* a callable ``choose(results)`` (sync or async): it gets every branch's :class:`RunResult`
  in branch order and returns the winner's index, the winning result itself, or None to turn
  every branch down.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal, Protocol, TypeAlias, TypeVar

from pydantic_core import to_jsonable_python

from sunroom.agent import events as ev
from sunroom.agent.budget import BudgetTracker
from sunroom.agent.calls import Publish
from sunroom.agent.result import RunResult, Status
from sunroom.errors import UsageError

__all__ = [
    "MAX_BRANCHES",
    "Branch",
    "Choose",
    "Chooser",
    "ask",
    "branch_count",
    "choose_label",
    "no_winner",
    "run_branches",
    "vote",
]

log = logging.getLogger("sunroom.agent")

MAX_BRANCHES = 64
"""The most branches one run may have (a kernel forks at most 64 copies at once)."""

Chooser: TypeAlias = Callable[
    [list[RunResult]], "int | RunResult | None | Awaitable[int | RunResult | None]"
]
"""``choose(results)``: the winner's index, its result, or None (no branch is chosen)."""

Choose: TypeAlias = "Literal['first', 'vote'] | Chooser"
"""How a branched run picks its answer (see the module docstring)."""


def branch_count(branches: int | None) -> int:
    """*branches* as a count (None: 1). Raises UsageError outside 1-64."""
    if branches is None:
        return 1
    if (
        not isinstance(branches, int)
        or isinstance(branches, bool)
        or not 1 <= branches <= MAX_BRANCHES
    ):
        raise UsageError(
            f"branches must be an int from 1 to {MAX_BRANCHES} or None, got {branches!r}"
        )
    return branches


def choose_label(choose: object) -> str:
    """``"first"``, ``"vote"`` or the chooser's name. Raises UsageError for anything else."""
    if choose == "first" or choose == "vote":
        return str(choose)
    if isinstance(choose, str) or not callable(choose):
        raise UsageError(
            f"choose must be 'first', 'vote' or a callable taking the results, got {choose!r}"
        )
    name = getattr(choose, "__qualname__", None)
    return name if isinstance(name, str) else type(choose).__name__


def _key(output: object) -> str:
    """The canonical JSON of an output: equal answers group together whatever their key order."""
    data = to_jsonable_python(output, fallback=repr)
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def vote(results: Mapping[int, RunResult], order: Sequence[int]) -> tuple[int | None, str]:
    """The majority winner among successful outputs, and the reason (None: none succeeded).

    *order* lists branch indices as they finished; it breaks ties.
    """
    groups: dict[str, list[int]] = {}
    for i in order:
        if results[i].ok:
            groups.setdefault(_key(results[i].output), []).append(i)
    if not groups:
        return None, "no branch succeeded"
    best = max(groups.values(), key=len)  # the first largest: its first member finished first
    return best[0], f"{len(best)} of {len(results)} branches agreed on the output"


async def ask(choose: Chooser, results: list[RunResult]) -> int | None:
    """Call the chooser and return the index it picked (None: none).

    Raises UsageError when it returns anything but an index in range, one of *results* or
    None; whatever the chooser raises propagates.
    """
    picked = choose(list(results))
    if inspect.isawaitable(picked):
        picked = await picked
    if picked is None:
        return None
    if isinstance(picked, RunResult):
        for i, r in enumerate(results):
            if r is picked:
                return i
        for i, r in enumerate(results):
            if r == picked:
                return i
    elif isinstance(picked, int) and not isinstance(picked, bool) and 0 <= picked < len(results):
        return picked
    raise UsageError(
        f"choose returned {picked!r}; it must return a branch index from 0 to "
        f"{len(results) - 1}, one of the results it was given, or None"
    )


def no_winner(results: Sequence[RunResult]) -> tuple[Status, str]:
    """The status and error of a branched run that no branch won.

    The status is the most common among the branches (a tie goes to the lowest branch); the
    error counts each.
    """
    counts = Counter(r.status for r in results)
    if not counts:
        return "cancelled", "no branch finished"
    status = max(counts, key=lambda s: counts[s])
    parts = ", ".join(f"{n} {s}" for s, n in counts.items())
    return status, f"no branch succeeded ({parts})"


class Branch(Protocol):
    """What :func:`run_branches` needs of a branch: a forked session."""

    @property
    def branch(self) -> str | None:
        """The branch id its events carry."""

    async def run(self, task: str) -> RunResult:
        """Run *task* to its terminal result."""

    async def aclose(self) -> None:
        """Cancel its run and close its kernel (idempotent)."""


B = TypeVar("B", bound=Branch)


async def run_branches(
    task: str,
    kids: Sequence[B],
    choose: Choose,
    label: str,
    *,
    session_id: str,
    tracker: BudgetTracker,
    publish: Publish,
    redact: Callable[[str], str],
    adopt: Callable[[B], None],
    live: list[B],
) -> RunResult:
    """Run *task* in every branch of *kids*, pick one by *choose*, adopt it. Never raises.

    Publishes ``BranchesStarted``, ``BranchChosen`` and the session's ``SessionEnded`` through
    *publish*. While the branches run, *live* holds them (the session steers and closes them
    through it); the losers are closed (their runs cancelled, if still going) before the
    winner is handed to *adopt* and then closed (it holds the session's former kernel by
    then). The result is the winner's, with the spend of every branch (*tracker*); a cancel
    or a failure of *choose* becomes the result's status.
    """
    start = tracker.snapshot()
    live[:] = kids
    publish(ev.BranchesStarted, branches=tuple(str(k.branch) for k in kids), choose=label)
    loop = asyncio.get_running_loop()
    runs = {
        loop.create_task(kid.run(task), name=f"sunroom-branch-{i}"): i for i, kid in enumerate(kids)
    }
    results: dict[int, RunResult] = {}
    chosen, reason, failure = await _pick(runs, results, choose, label, session_id)
    for i, kid in enumerate(kids):
        if i != chosen:
            await kid.aclose()
    for t, i in runs.items():
        if i not in results:
            results[i] = await t
    live.clear()
    winner = None if chosen is None else kids[chosen]
    publish(ev.BranchChosen, chosen=None if winner is None else winner.branch, reason=reason)
    if winner is not None:
        adopt(winner)
        await winner.aclose()
    spend = tracker.snapshot().since(start)
    status, error, output, turns = _outcome(failure, chosen, results, choose, label)
    result = RunResult(
        status=status,
        output=output,
        usage=spend.usage,
        cost_micro_usd=spend.cost_micro_usd if spend.cost_known else None,
        turns=turns,
        model_calls=spend.model_calls,
        sub_calls=spend.sub_calls,
        session_id=session_id,
        error=None if error is None else redact(error),
    )
    publish(ev.SessionEnded, result=result)
    return result


async def _pick(
    runs: Mapping[asyncio.Task[RunResult], int],
    results: dict[int, RunResult],
    choose: Choose,
    label: str,
    session_id: str,
) -> tuple[int | None, str, tuple[Status, str] | None]:
    """Wait for the branches as *choose* needs; (chosen index, reason, failure or None).

    Fills *results* with every branch that finished. A cancel of the run, or an exception
    in the chooser (a bug, as in a hook) or in sunroom, is a failure: (status, error).
    """
    order: list[int] = []  # branch indices as they finished
    chosen: int | None = None
    reason = "no branch succeeded"
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
                    return chosen, "the first branch to succeed", None
        if choose == "vote":
            chosen, reason = vote(results, order)
        elif callable(choose):
            asking = True
            chosen = await ask(choose, [results[i] for i in range(len(runs))])
            reason = f"chosen by {label}" if chosen is not None else f"{label} chose none"
    except asyncio.CancelledError:
        return None, "the run was cancelled", ("cancelled", "the run was cancelled")
    except Exception as exc:  # a bug in the chooser (as in a hook), or in sunroom
        log.exception("session %s: the branched run failed", session_id)
        what = "choose failed" if asking else "internal error"
        error = f"{what}: {type(exc).__name__}: {exc}"
        return None, error, ("internal_error", error)
    return chosen, reason, None


def _outcome(
    failure: tuple[Status, str] | None,
    chosen: int | None,
    results: Mapping[int, RunResult],
    choose: Choose,
    label: str,
) -> tuple[Status, str | None, object, int]:
    """The branched run's (status, error, output, turns)."""
    if failure is not None:
        return failure[0], failure[1], None, 0
    if chosen is not None:
        won = results[chosen]
        return won.status, won.error, won.output, won.turns
    if callable(choose) and results:
        return "rejected", f"{label} turned every branch down", None, 0
    status, error = no_winner([results[i] for i in sorted(results)])
    return status, error, None, 0
