"""``sunroom.eval``: long-context evaluation of RLM sessions against other arms, with intervals.

``evaluate(model=..., tasks=..., lengths=..., arms=..., seeds=30, out=DIR)`` (async; the sync
twin is :func:`evaluate_sync`) runs every arm on every seeded task and returns
:class:`~sunroom.eval.results.Results`: one :class:`~sunroom.eval.results.Run` per (task,
length, seed, arm), a summary per (task, length, arm) with a 95% interval, and the paired
differences between arms. ``sunroom eval`` is the command (:mod:`sunroom.cli.eval`);
docs/eval.md explains the tasks, arms, statistics and files.

Modules: :mod:`~sunroom.eval.tasks` (generators, scoring), :mod:`~sunroom.eval.arms` (how
each arm runs), :mod:`~sunroom.eval.dspy_arm` (``dspy.RLM``), :mod:`~sunroom.eval.fake`
(deterministic models), :mod:`~sunroom.eval.stats` (intervals), :mod:`~sunroom.eval.results`
(the JSON file), :mod:`~sunroom.eval.report` (summary, table, plot), :mod:`~sunroom.eval.runner`
(concurrency, budgets, resume, progress).
"""

from __future__ import annotations

from sunroom.eval.arms import ARMS
from sunroom.eval.results import Cell, Config, Paired, Results, Run
from sunroom.eval.runner import DEFAULT_ARMS, DEFAULT_LENGTHS, evaluate, evaluate_sync
from sunroom.eval.tasks import ALL_TASKS, TASKS, Task, make_task, score

__all__ = [
    "ALL_TASKS",
    "ARMS",
    "DEFAULT_ARMS",
    "DEFAULT_LENGTHS",
    "TASKS",
    "Cell",
    "Config",
    "Paired",
    "Results",
    "Run",
    "Task",
    "evaluate",
    "evaluate_sync",
    "make_task",
    "score",
]
