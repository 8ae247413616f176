"""What an evaluation's runs add up to: the summary, the paired differences, a table, a plot.

:func:`summarize` turns runs into :class:`~sunroom.eval.results.Cell` rows (one per task,
length and arm) and :class:`~sunroom.eval.results.Paired` rows (each pair of arms over the
items both ran); :func:`markdown` renders both as markdown tables; :func:`plot` draws accuracy
against length, one panel per task and one line per arm with its 95% intervals, as a PNG
(it needs matplotlib, the ``eval`` extra).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from sunroom import extras
from sunroom.eval.arms import ARMS
from sunroom.eval.results import Cell, Paired, Run
from sunroom.eval.stats import bootstrap_mean, paired_difference, wilson
from sunroom.eval.tasks import ALL_TASKS

__all__ = ["COMPARISONS", "format_cost", "label", "markdown", "plot", "summarize"]

COMPARISONS: Final = (
    ("rlm-no-sub", "long-prompt"),
    ("rlm", "long-prompt"),
    ("best-of-k", "long-prompt"),
    ("dspy-rlm", "long-prompt"),
    ("rlm", "rlm-no-sub"),
    ("best-of-k", "rlm"),
    ("dspy-rlm", "rlm"),
)
"""The paired differences reported, (a, b) meaning a minus b: every arm against the long
prompt, what sub-calls add, what k branches add, and DSPy's RLM against sunroom's."""


def label(length: int) -> str:
    """A length as people write it: ``8K``, ``1M``, ``2500``."""
    if length >= 1_000_000 and length % 1_000_000 == 0:
        return f"{length // 1_000_000}M"
    if length >= 1_000 and length % 1_000 == 0:
        return f"{length // 1_000}K"
    return str(length)


def format_cost(costs: Iterable[int | None]) -> str:
    """Total micro-USD, or "unknown" when any cost is unknown (or there is none)."""
    values = list(costs)
    if not values or any(c is None for c in values):
        return "unknown"
    return f"{sum(c for c in values if c is not None):,}"


def _order(arm: str) -> int:
    return ARMS.index(arm) if arm in ARMS else len(ARMS)


def _task_order(task: str) -> int:
    return ALL_TASKS.index(task) if task in ALL_TASKS else len(ALL_TASKS)


def _cell(task: str, length: int, arm: str, runs: Sequence[Run], seed: int) -> Cell:
    n = len(runs)
    metric = runs[0].metric
    if metric == "f1":
        interval = bootstrap_mean([r.score for r in runs], seed=seed)
    else:
        interval = wilson(sum(1 for r in runs if r.score >= 1.0), n)
    costs = [r.cost_micro_usd for r in runs]
    wall = math.fsum(r.wall_s for r in runs)
    overhead = math.fsum(r.overhead_s for r in runs)
    return Cell(
        task=task,
        length=length,
        arm=arm,
        metric=metric,
        accuracy=interval.estimate,
        ci_low=interval.low,
        ci_high=interval.high,
        n=n,
        errors=sum(1 for r in runs if r.error is not None),
        input_tokens=sum(r.input_tokens for r in runs) / n,
        output_tokens=sum(r.output_tokens for r in runs) / n,
        cost_micro_usd=None if any(c is None for c in costs) else sum(c or 0 for c in costs),
        sub_calls=sum(r.sub_calls for r in runs) / n,
        wall_s=wall / n,
        startup_s=math.fsum(r.startup_s for r in runs) / n,
        model_s=math.fsum(r.model_s for r in runs) / n,
        overhead_s=overhead / n,
        overhead_share=overhead / wall if wall > 0 else None,
    )


def summarize(runs: Iterable[Run], *, seed: int = 0) -> tuple[list[Cell], list[Paired]]:
    """The summary rows and the paired differences of *runs* (bootstraps seeded by *seed*).

    Each pair of :data:`COMPARISONS` that both ran on a (task, length) is compared on the
    seeds both ran.
    """
    groups: dict[tuple[str, int, str], list[Run]] = defaultdict(list)
    for run in runs:
        groups[(run.task, run.length, run.arm)].append(run)
    keys = sorted(groups, key=lambda k: (_task_order(k[0]), k[0], k[1], _order(k[2]), k[2]))
    cells = [
        _cell(task, length, arm, groups[(task, length, arm)], seed) for task, length, arm in keys
    ]
    paired: list[Paired] = []
    items = sorted(
        {(task, length) for task, length, _ in keys}, key=lambda k: (_task_order(k[0]), k)
    )
    for task, length in items:
        arms = {arm for t, n, arm in keys if (t, n) == (task, length)}
        for later, earlier in (c for c in COMPARISONS if c[0] in arms and c[1] in arms):
            a = {r.seed: r.score for r in groups[(task, length, later)]}
            b = {r.seed: r.score for r in groups[(task, length, earlier)]}
            common = sorted(a.keys() & b.keys())
            interval = paired_difference([a[s] for s in common], [b[s] for s in common], seed=seed)
            paired.append(
                Paired(
                    task=task,
                    length=length,
                    a=later,
                    b=earlier,
                    difference=interval.estimate,
                    ci_low=interval.low,
                    ci_high=interval.high,
                    n=interval.n,
                )
            )
    return cells, paired


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(width) if i >= right_from else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "| " + " | ".join(cells) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if i >= right_from else ("-" * (w + 2))
            for i, w in enumerate(widths)
        )
        + "|"
    )  # noqa: E501
    return [line(header), rule, *(line(row) for row in rows)]


def markdown(cells: Sequence[Cell], paired: Sequence[Paired], *, title: str = "") -> str:
    """The summary and the paired differences as markdown tables (with a heading if *title*)."""
    header = ("task", "length", "arm", "n", "accuracy [95% CI]", "errors", "in tokens",
              "out tokens", "cost µUSD", "sub-calls", "wall s", "overhead")  # fmt: skip
    rows = [
        (
            c.task,
            label(c.length),
            c.arm,
            str(c.n),
            f"{c.accuracy:.2f} [{c.ci_low:.2f}, {c.ci_high:.2f}]"
            + (" F1" if c.metric == "f1" else ""),
            str(c.errors),
            f"{c.input_tokens:,.0f}",
            f"{c.output_tokens:,.0f}",
            "unknown" if c.cost_micro_usd is None else f"{c.cost_micro_usd:,}",
            f"{c.sub_calls:.1f}",
            f"{c.wall_s:.2f}",
            "-" if c.overhead_share is None else f"{c.overhead_share:.0%}",
        )
        for c in cells
    ]
    lines = [f"# {title}", ""] if title else []
    lines += _table(header, rows, right_from=3)
    if paired:
        lines += ["", "Paired differences (a - b over the same seeds, 95% bootstrap CI):", ""]
        prow = [
            (p.task, label(p.length), p.a, p.b, str(p.n),
             f"{p.difference:+.2f} [{p.ci_low:+.2f}, {p.ci_high:+.2f}]")
            for p in paired
        ]  # fmt: skip
        lines += _table(("task", "length", "a", "b", "n", "a - b [95% CI]"), prow, right_from=4)
    return "\n".join(lines) + "\n"


def plot(cells: Sequence[Cell], path: Path, *, title: str = "") -> None:
    """Accuracy against length per arm with 95% intervals, one panel per task, as a PNG.

    Raises UsageError naming the ``eval`` extra when matplotlib is not installed.
    """
    extras.require("eval", "the plot (plot.png)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({c.task for c in cells}, key=_task_order)
    columns = min(3, max(len(tasks), 1))
    rows = math.ceil(len(tasks) / columns) if tasks else 1
    figure, axes = plt.subplots(
        rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False, sharey=True
    )
    for index, task in enumerate(tasks):
        ax = axes[index // columns][index % columns]
        mine = [c for c in cells if c.task == task]
        arms = sorted({c.arm for c in mine}, key=_order)
        for offset, arm in enumerate(arms):
            points = sorted((c for c in mine if c.arm == arm), key=lambda c: c.length)
            shift = 1 + 0.04 * (offset - (len(arms) - 1) / 2)  # side by side on a log axis
            xs = [c.length * shift for c in points]
            ys = [c.accuracy for c in points]
            errors = [
                [c.accuracy - c.ci_low for c in points],
                [c.ci_high - c.accuracy for c in points],
            ]
            ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=arm)
        lengths = sorted({c.length for c in mine})
        ax.set_xscale("log")
        ax.set_xticks(lengths, [label(n) for n in lengths])
        ax.minorticks_off()
        metric = "F1" if mine and mine[0].metric == "f1" else "accuracy"
        ax.set_title(f"{task} ({metric})", fontsize=10)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("context length (characters)")
        ax.grid(alpha=0.3)
    for index in range(len(tasks), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    axes[0][0].set_ylabel("score (95% CI)")
    handles, names = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=max(len(names), 1), fontsize=9)
    if title:
        figure.suptitle(title, fontsize=11)
    figure.tight_layout(rect=(0, 0.08, 1, 0.95 if title else 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
