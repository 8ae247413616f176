"""Picking the answer of a branched run: ``run(task, branches=k, choose=...)``.

A branched run forks the session into k branches that run the same task concurrently; this
module holds the rules that pick one of them (the session does the forking and the adopting):

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

import inspect
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Literal, TypeAlias

from pydantic_core import to_jsonable_python

from sunroom.agent.result import RunResult, Status
from sunroom.errors import UsageError

__all__ = [
    "MAX_BRANCHES",
    "Choose",
    "Chooser",
    "ask",
    "branch_count",
    "choose_label",
    "no_winner",
    "vote",
]

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
