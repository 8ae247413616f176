"""Running an evaluation: :func:`evaluate` (async core) and :func:`evaluate_sync` (its twin).

Every (task, length, seed) item is generated from its seed, then each arm runs on it; at most
``parallel`` items run at once (their arms one after another, so a context is in memory once
per item in flight). With ``out``, ``out/results.json`` is rewritten (atomically, at most once
a second and at the end) as runs finish, with ``stopped: "incomplete"`` until the end, so an
interrupted evaluation loses at most a second of runs; ``resume=True`` continues from it,
running only the (task, length, seed, arm) runs it lacks. At the end it holds the summary and
the paired differences, and ``out/table.md`` and ``out/plot.png`` are written.

Budgets: ``budget`` (a :class:`~sunroom.agent.Budget`) bounds each session run (model calls,
tokens, cost, wall time), ``timeout_s`` each long-prompt call and session, and
``max_total_cost_micro_usd`` the whole evaluation: once the known cost reaches it no new run
starts (runs in flight finish) and the results say ``stopped: "budget"``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, TextIO

from sunroom import extras
from sunroom.agent import Budget
from sunroom.errors import UsageError
from sunroom.eval import report
from sunroom.eval import results as files
from sunroom.eval.arms import ARMS, ArmConfig, run_long_prompt, run_session
from sunroom.eval.results import Cell, Config, Results, Run
from sunroom.eval.tasks import ALL_TASKS, SEMANTIC_TASKS, TASKS, Task, make_task
from sunroom.providers import Model, Settings
from sunroom.providers import model as build_model
from sunroom.sandbox.backends import DEFAULT_BACKEND, NAMES

if TYPE_CHECKING:
    from sunroom.embeddings.functions import Embedder
    from sunroom.sandbox.backend import Backend

__all__ = ["DEFAULT_ARMS", "DEFAULT_LENGTHS", "Progress", "evaluate", "evaluate_sync", "run_arm"]

DEFAULT_ARMS: Final = ("long-prompt", "rlm-no-sub", "rlm", "best-of-k")
DEFAULT_LENGTHS: Final = (8_000, 32_000)
_SAVE_EVERY_S: Final = 1.0


async def run_arm(task: Task, arm: str, model: Model, sub_model: Model, config: ArmConfig) -> Run:
    """Run *arm* on *task*; every failure is a run with ``error`` set (score 0), never raised."""
    if arm == "long-prompt":
        return await run_long_prompt(task, model, config)
    if arm in ("rlm-no-sub", "rlm", "best-of-k"):
        return await run_session(task, arm, model, sub_model, config)
    if arm == "dspy-rlm":
        from sunroom.eval.dspy_arm import run_dspy_rlm  # imports dspy: only when asked for

        return await run_dspy_rlm(task, model, sub_model, config)
    raise ValueError(f"unknown arm {arm!r}; the arms are {', '.join(ARMS)}")


class Progress:
    """A one-line progress bar on *stream*: runs done, running mean score, cost, elapsed time.

    On a terminal the line is redrawn in place; otherwise a line is written every tenth of the
    runs (and at the end), so logs stay short.
    """

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.score = 0.0
        self.cost = 0
        self.unpriced = 0
        self.started = time.perf_counter()
        self._tty = self.stream.isatty()
        self._step = max(total // 10, 1)

    def line(self) -> str:
        """The current line (no newline)."""
        width = 24
        filled = round(width * self.done / self.total) if self.total else width
        mean = self.score / self.done if self.done else 0.0
        cost = f"{self.cost:,} µUSD" + (f" (+{self.unpriced} unpriced)" if self.unpriced else "")
        elapsed = time.perf_counter() - self.started
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} runs  "
            f"score {mean:.2f}  cost {cost}  {elapsed:.0f}s"
        )

    def update(self, run: Run) -> None:
        """Count *run* and redraw."""
        self.done += 1
        self.score += run.score
        if run.cost_micro_usd is None:
            self.unpriced += 1
        else:
            self.cost += run.cost_micro_usd
        if self._tty:
            self.stream.write("\r" + self.line())
            if self.done == self.total:
                self.stream.write("\n")
        elif self.done % self._step == 0 or self.done == self.total:
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the line on a terminal if the bar was left unfinished."""
        if self._tty and 0 < self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()


def _check(tasks: Sequence[str], lengths: Sequence[int], arms: Sequence[str], seeds: int,
           parallel: int, k: int, embeddings: object, backend: object) -> None:  # fmt: skip
    bad = [t for t in tasks if t not in ALL_TASKS] + [a for a in arms if a not in ARMS]
    if bad:
        raise UsageError(
            f"unknown task or arm {', '.join(map(repr, bad))}: the tasks are "
            f"{', '.join(ALL_TASKS)} and the arms {', '.join(ARMS)}"
        )
    if not tasks or not lengths or not arms:
        raise UsageError("an evaluation needs at least one task, one length and one arm")
    if any(n < 1_000 for n in lengths):
        raise UsageError("every length must be at least 1,000 characters")
    if seeds < 1 or parallel < 1:
        raise UsageError("seeds and parallel must be at least 1")
    if isinstance(backend, str) and backend not in NAMES:
        raise UsageError(f"unknown backend {backend!r}: the backends are {', '.join(NAMES)}")
    if "best-of-k" in arms and not 2 <= k <= 64:
        raise UsageError(f"k must be from 2 to 64, got {k}")
    semantic = [t for t in tasks if t in SEMANTIC_TASKS]
    if semantic and embeddings is None:
        raise UsageError(f"{', '.join(semantic)} needs an embedder (--embeddings MODEL)")
    if "dspy-rlm" in arms:
        extras.require("dspy", "the dspy-rlm arm")


def _name(spec: Model | str) -> str:
    return spec if isinstance(spec, str) else spec.name


async def evaluate(
    *,
    model: Model | str,
    sub_model: Model | str | None = None,
    tasks: Sequence[str] = TASKS,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    arms: Sequence[str] = DEFAULT_ARMS,
    seeds: int = 30,
    seed: int = 0,
    out: Path | str | None = None,
    resume: bool = False,
    parallel: int = 1,
    k: int = 3,
    choose: Literal["first", "vote"] = "vote",
    backend: str | Backend = DEFAULT_BACKEND,
    budget: Budget | None = None,
    max_turns: int = 20,
    timeout_s: float | None = 600.0,
    max_total_cost_micro_usd: int | None = None,
    base_url: str | None = None,
    embeddings: Embedder | None = None,
    progress: TextIO | bool = False,
    plot: bool = True,
    code_tool: bool = True,
    max_output_tokens: int | None = None,
) -> Results:
    """Run every arm on every (task, length, seed) item and return the results.

    Args:
        model: the root model (a :class:`~sunroom.providers.Model`, or ``"provider:name"``,
            built with *base_url* and closed at the end).
        sub_model: the model of ``predict``/``predict_many`` and of DSPy's sub-calls
            (default: *model*).
        tasks: the tasks to run (:data:`~sunroom.eval.tasks.ALL_TASKS`).
        lengths: context lengths in characters (at least 1,000).
        arms: the arms to run (:data:`~sunroom.eval.arms.ARMS`).
        seeds: items per (task, length): seeds ``0 .. seeds-1``, each its own task.
        seed: the base seed every task's generator is seeded from.
        out: a directory for ``results.json``, ``table.md`` and ``plot.png`` (None: nothing
            is written).
        resume: continue ``out/results.json``: run only the runs it lacks. It must have the
            same models, seed, k and choose; tasks, lengths, arms and seeds may grow (the
            file's config becomes the union). Without it an existing results file is an error.
        parallel: items in flight at once.
        k: branches of ``best-of-k`` (2-64).
        choose: how ``best-of-k`` picks: ``vote`` or ``first``.
        backend: the kernel backend of the sessions.
        budget: each session run's limits (model calls, tokens, cost, wall time).
        max_turns: root model turns per session run.
        timeout_s: seconds per long-prompt call (a session's is ``budget.max_wall_s``).
        max_total_cost_micro_usd: stop starting runs once the known cost reaches this.
        base_url: the endpoint of models given as strings.
        embeddings: an embedder for ``niah-semantic`` (bound as ``embed``/``search``).
        progress: a stream for the progress bar, True for stderr, False for none.
        max_output_tokens: a cap on each reply's tokens for the models built from strings (a
            reply cut there ends with ``length``); Model objects keep their own settings.
        code_tool: sessions offer the ``execute_code`` tool; False: the model writes fenced
            ```` ```python ```` blocks (for models without tool calling).
        plot: write ``out/plot.png`` (needs matplotlib: without it the plot is skipped with a
            warning on the progress stream, or stderr, and everything else is written).

    Raises UsageError for bad arguments, an existing results file without *resume*, or one
    whose config differs. A run that fails is recorded (score 0, ``error`` set), not raised.
    """
    _check(tasks, lengths, arms, seeds, parallel, k, embeddings, backend)
    settings = Settings(max_output_tokens=max_output_tokens)
    owned: list[Model] = []  # built here from strings: closed here

    def built(spec: Model | str) -> Model:
        if not isinstance(spec, str):
            return spec
        owned.append(build_model(spec, base_url=base_url, settings=settings))
        return owned[-1]

    config = Config(
        model=_name(model),
        sub_model=_name(sub_model if sub_model is not None else model),
        tasks=tuple(tasks),
        lengths=tuple(lengths),
        arms=tuple(arms),
        seeds=seeds,
        seed=seed,
        k=k,
        choose=choose,
    )
    try:
        root = built(model)
        sub = root if sub_model is None else built(sub_model)
        return await _evaluate(
            config, root, sub, out=None if out is None else Path(out), resume=resume,
            parallel=parallel, budget=max_total_cost_micro_usd, progress=progress, plot=plot,
            arm_config=ArmConfig(
                backend=backend, budget=budget, max_turns=max_turns, timeout_s=timeout_s,
                k=k, choose=choose, embeddings=embeddings, code_tool=code_tool,
            ),
        )  # fmt: skip
    finally:
        for owned_model in owned:
            await owned_model.aclose()


_SAME_ON_RESUME: Final = ("model", "sub_model", "seed", "k", "choose")
"""What a resumed evaluation must share with the file (tasks, lengths, arms and seeds may grow)."""


def _prior(config: Config, path: Path | None, resume: bool) -> tuple[Config, list[Run]]:
    """The config to record and the runs already in *path* (none when it does not exist)."""
    if path is None or not path.exists():
        return config, []
    if not resume:
        raise UsageError(
            f"{path} already exists: resume it (--resume) or choose another output directory"
        )
    try:
        previous = files.read(path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    differ = [f for f in _SAME_ON_RESUME if getattr(previous.config, f) != getattr(config, f)]
    if differ:
        raise UsageError(
            f"{path} was written with another {', '.join(differ)}; resume it with the same "
            "models, seed, k and choose, or choose another output directory"
        )
    old = previous.config
    merged = config.model_copy(
        update={
            "tasks": (*old.tasks, *(t for t in config.tasks if t not in old.tasks)),
            "lengths": (*old.lengths, *(n for n in config.lengths if n not in old.lengths)),
            "arms": (*old.arms, *(a for a in config.arms if a not in old.arms)),
            "seeds": max(old.seeds, config.seeds),
        }
    )
    return merged, list(previous.runs)


class _Ledger:
    """The runs of an evaluation as they finish: spend, the stop reason, the file, the bar."""

    def __init__(
        self, config: Config, runs: list[Run], path: Path | None, budget: int | None,
        bar: Progress | None,
    ) -> None:  # fmt: skip
        self.config = config
        self.runs = runs
        self.path = path
        self.budget = budget
        self.bar = bar
        self.spent = sum(r.cost_micro_usd or 0 for r in runs)
        self.stopped: str | None = None
        self._saved = time.perf_counter()

    def going(self) -> bool:
        """Whether new runs may start (the evaluation was not stopped)."""
        return self.stopped is None

    def record(self, run: Run) -> None:
        """Keep *run*, count its cost against the budget, redraw, save at most once a second."""
        self.runs.append(run)
        self.spent += run.cost_micro_usd or 0
        if self.budget is not None and self.spent >= self.budget:
            self.stopped = "budget"
        if self.bar is not None:
            self.bar.update(run)
        if time.perf_counter() - self._saved >= _SAVE_EVERY_S:
            self.save("incomplete")

    def save(self, stopped: str | None) -> None:
        """Write the runs so far (no summary) with *stopped*."""
        self._saved = time.perf_counter()
        if self.path is not None:
            files.write(
                self.path, Results(config=self.config, runs=tuple(self.runs), stopped=stopped)
            )


async def _evaluate(
    config: Config,
    root: Model,
    sub: Model,
    *,
    out: Path | None,
    resume: bool,
    parallel: int,
    budget: int | None,
    progress: TextIO | bool,
    plot: bool,
    arm_config: ArmConfig,
) -> Results:
    path = None if out is None else out / "results.json"
    wanted = config
    config, runs = _prior(config, path, resume)
    done = {r.key for r in runs}
    todo = {
        (task, length, s): [a for a in wanted.arms if (task, length, s, a) not in done]
        for length in wanted.lengths
        for task in wanted.tasks
        for s in range(wanted.seeds)
    }
    stream = sys.stderr if progress is True else progress or None
    bar = None if stream is None else Progress(sum(map(len, todo.values())), stream)
    ledger = _Ledger(config, runs, path, budget, bar)
    gate = asyncio.Semaphore(parallel)

    async def item(name: str, length: int, sample: int, arms: list[str]) -> None:
        async with gate:
            if not ledger.going():
                return
            task = await asyncio.to_thread(make_task, name, length, sample, seed=config.seed)
            for arm in arms:
                if not ledger.going():
                    return
                ledger.record(await run_arm(task, arm, root, sub, arm_config))

    try:
        await asyncio.gather(*(item(*key, arms) for key, arms in todo.items() if arms))
    except BaseException:
        ledger.save("interrupted")
        raise
    finally:
        if bar is not None:
            bar.close()
    return _finish(config, runs, ledger.stopped, out, stream, plot=plot)


def _finish(
    config: Config, runs: list[Run], stopped: str | None, out: Path | None,
    stream: TextIO | None, *, plot: bool,
) -> Results:  # fmt: skip
    """The results with their summary; with *out*, written there with the table and plot."""
    cells, paired = report.summarize(runs, seed=config.seed)
    results = Results(
        config=config,
        runs=tuple(sorted(runs, key=lambda r: (r.task, r.length, r.seed, r.arm))),
        summary=tuple(cells),
        paired=tuple(paired),
        stopped=stopped,
    )
    if out is not None:
        files.write(out / "results.json", results)
        title = f"sunroom eval: {config.model} (sub: {config.sub_model})"
        (out / "table.md").write_text(report.markdown(cells, paired, title=title), encoding="utf-8")
        if plot:
            _plot(cells, out / "plot.png", title, stream)
    return results


def _plot(cells: Sequence[Cell], path: Path, title: str, stream: TextIO | None) -> None:
    if extras.missing("eval") is not None:
        message = (
            "sunroom: plot.png was skipped because matplotlib is missing; install it with "
            "pip install 'sunroom[eval]' (results.json and table.md were written)\n"
        )
        (stream or sys.stderr).write(message)
        return
    report.plot(cells, path, title=title)


def evaluate_sync(
    *,
    model: Model | str,
    sub_model: Model | str | None = None,
    tasks: Sequence[str] = TASKS,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    arms: Sequence[str] = DEFAULT_ARMS,
    seeds: int = 30,
    seed: int = 0,
    out: Path | str | None = None,
    resume: bool = False,
    parallel: int = 1,
    k: int = 3,
    choose: Literal["first", "vote"] = "vote",
    backend: str | Backend = DEFAULT_BACKEND,
    budget: Budget | None = None,
    max_turns: int = 20,
    timeout_s: float | None = 600.0,
    max_total_cost_micro_usd: int | None = None,
    base_url: str | None = None,
    embeddings: Embedder | None = None,
    progress: TextIO | bool = False,
    plot: bool = True,
    code_tool: bool = True,
    max_output_tokens: int | None = None,
) -> Results:
    """:func:`evaluate` on a fresh event loop (not from inside a running one); same arguments."""
    return asyncio.run(
        evaluate(
            model=model, sub_model=sub_model, tasks=tasks, lengths=lengths, arms=arms,
            seeds=seeds, seed=seed, out=out, resume=resume, parallel=parallel, k=k,
            choose=choose, backend=backend, budget=budget, max_turns=max_turns,
            timeout_s=timeout_s, max_total_cost_micro_usd=max_total_cost_micro_usd,
            base_url=base_url, embeddings=embeddings, progress=progress, plot=plot,
            code_tool=code_tool, max_output_tokens=max_output_tokens,
        )
    )  # fmt: skip
