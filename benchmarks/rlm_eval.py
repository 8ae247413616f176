"""Long-context evaluation: a plain long-prompt baseline beside an RLM session, per length.

This is the original script, now a thin wrapper over :mod:`sunroom.eval` (the tasks, the fake
models and the arms live there); ``sunroom eval`` is the full command, with more tasks and
arms, seeds, confidence intervals, a results file, ``--resume`` and a plot (docs/eval.md).

Tasks are generated locally and seeded, so a run is reproducible and needs no data set:

* ``niah``: single-needle retrieval in the style of RULER's S-NIAH. An essay-like haystack
  of generated filler holds one needle, "The special magic number for <key> is <7 digits>.",
  at a random depth; the question asks for the number. Scored by string match (RULER).
* ``oolong-count`` / ``oolong-common``: OOLONG-style aggregation over generated labelled
  records ("Record 000123 | date: ... | user: ... | label: billing | note: ..."): how many
  records have label L (exact integer), which label is most common (exactly that label).
* ``niah-semantic`` (only with ``--embeddings MODEL``, not in the default ``--tasks``): a needle
  worded unlike its question ("the passcode of the <key> archive" / "the lock on the <key>
  document store opens with the secret PIN <n>") among eleven distractors with the same key and
  other numbers. Matching words finds them all; the efficient strategy is the host function
  ``search`` (embedding similarity) that sessions get from ``AsyncSession(embeddings=...)``:
  rank the paragraphs, read the best one. Scored by string match, no other 7-digit number.

For every task and length three methods run against the configured model:

* ``baseline``: one ``Model.complete`` with the whole context in the prompt;
* ``rlm``: an ``AsyncSession(preset="rlm")`` with the context bound as the kernel variable
  ``context`` (never in the prompt); the model reads it with code, may fan out to the
  sub-model with ``predict``/``predict_many``, and hands the answer to ``submit``;
* ``rlm-best-of-k``: the same session, run with ``branches=k`` (``--k``, default 3): k
  candidate programs over the one bound context, each in a fork of the kernel, and the answer
  picked by ``--choose`` (``vote``, the default, or ``first``). The run's budget covers all
  k branches; tokens, cost and sub-calls are those of every branch.

It prints one row per length and method: accuracy, mean input/output tokens, total cost in
micro-USD ("unknown" when a price is unknown), mean sub-calls and mean latency.

    python benchmarks/rlm_eval.py --model anthropic:claude-haiku-4-5
    python benchmarks/rlm_eval.py --model openai-compatible:qwen3 --base-url http://127.0.0.1:8000/v1 \\
        --lengths 8k,32k,128k --tasks niah,oolong-count --samples 3
    SUNROOM_MODEL=gemini:gemini-2.5-flash python benchmarks/rlm_eval.py --sub-model gemini:gemini-2.5-flash-lite
    python benchmarks/rlm_eval.py --fake --backend subprocess      # offline, deterministic
    python benchmarks/rlm_eval.py --fake --tasks niah-semantic --embeddings "$(sunroom embed --fetch all-MiniLM-L6-v2)"

``--fake`` runs the methods against deterministic ``FunctionModel``s that really solve the
tasks: the root writes Python that reads ``context``, calls ``predict``/``predict_many`` and
``submit``; the sub-model answers by reading its input. It exercises the harness, the session
and the kernel end to end without a network. ``--fake-error-rate p`` makes the fake root's
first program wrong with probability p (seeded by ``--seed``), so best-of-k has errors to vote
away.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sunroom.agent import Budget  # noqa: E402
from sunroom.eval.arms import ArmConfig, run_long_prompt, run_session  # noqa: E402
from sunroom.eval.fake import fake_models, fake_root, fake_sub  # noqa: E402
from sunroom.eval.report import format_cost  # noqa: E402
from sunroom.eval.results import Run  # noqa: E402
from sunroom.eval.tasks import (  # noqa: E402
    ALL_TASKS,
    LEGACY_TASKS,
    SEMANTIC_TASKS,
    Task,
    make_tasks,
    score,
)
from sunroom.providers import Model  # noqa: E402
from sunroom.providers import model as build_model  # noqa: E402

__all__ = ["fake_root", "fake_sub", "format_cost", "main", "make_tasks", "run_rlm", "score"]

TASKS = LEGACY_TASKS
METHODS = ("baseline", "rlm", "rlm-best-of-k")
DEFAULT_LENGTHS = "8k,32k,128k,1m"

# --- running the methods ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """One method on one task."""

    task: str
    length: int
    sample: int
    method: str
    correct: bool
    expected: str
    answer: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micro_usd: int | None = None
    sub_calls: int = 0
    latency_s: float = 0.0
    error: str | None = None

    @classmethod
    def of(cls, run: Run, method: str) -> Outcome:
        """The outcome of a :class:`sunroom.eval.results.Run`."""
        return cls(
            task=run.task,
            length=run.length,
            sample=run.seed,
            method=method,
            correct=run.score >= 1.0,
            expected=run.expected,
            answer=run.answer[:200],
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            cost_micro_usd=run.cost_micro_usd,
            sub_calls=run.sub_calls,
            latency_s=run.wall_s,
            error=run.error,
        )


async def run_baseline(task: Task, model: Model, *, timeout_s: float | None) -> Outcome:
    """The whole context in one prompt (``sunroom eval``'s ``long-prompt`` arm)."""
    run = await run_long_prompt(task, model, ArmConfig(timeout_s=timeout_s))
    return Outcome.of(run, "baseline")


async def run_rlm(
    task: Task,
    model: Model,
    sub_model: Model,
    *,
    backend: str,
    budget: Budget,
    max_turns: int,
    branches: int | None = None,
    choose: Literal["first", "vote"] = "vote",
    embeddings: Any = None,
) -> Outcome:
    """One RLM run of *task*; with *branches* (k) the best-of-k arm: k branches, *choose*."""
    config = ArmConfig(
        backend=backend,
        budget=budget,
        max_turns=max_turns,
        k=branches or 3,
        choose=choose,
        embeddings=embeddings,
    )
    arm = "rlm" if branches is None else "best-of-k"
    run = await run_session(task, arm, model, sub_model, config)
    return Outcome.of(run, "rlm" if branches is None else "rlm-best-of-k")


# --- the table --------------------------------------------------------------------------------


def _size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "km" else text
    value = int(float(number) * scale)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"a length must be positive: {text!r}")
    return value


def _label(length: int) -> str:
    if length >= 1_000_000 and length % 1_000_000 == 0:
        return f"{length // 1_000_000}M"
    if length >= 1_000 and length % 1_000 == 0:
        return f"{length // 1_000}K"
    return str(length)


def table(outcomes: Sequence[Outcome]) -> str:
    """One row per (length, method): accuracy, tokens, cost, sub-calls, latency."""
    header = ("length", "method", "n", "accuracy", "in_tokens", "out_tokens", "cost_uUSD",
              "sub_calls", "latency_s")  # fmt: skip
    rows = [header]
    keys = sorted(
        {(o.length, o.method) for o in outcomes}, key=lambda k: (k[0], METHODS.index(k[1]))
    )
    for length, method in keys:
        group = [o for o in outcomes if o.length == length and o.method == method]
        n = len(group)
        rows.append((
            _label(length), method, str(n),
            f"{sum(o.correct for o in group) / n:.2f}",
            f"{sum(o.input_tokens for o in group) // n:,}",
            f"{sum(o.output_tokens for o in group) // n:,}",
            format_cost([o.cost_micro_usd for o in group]),
            f"{sum(o.sub_calls for o in group) / n:.1f}",
            f"{sum(o.latency_s for o in group) / n:.2f}",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [
            cell.ljust(width) if i < 2 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Long-context eval: long-prompt baseline vs an RLM session, per length."
    )
    p.add_argument(
        "--model",
        default=os.environ.get("SUNROOM_MODEL"),
        help="root model 'provider:name' (default: $SUNROOM_MODEL)",
    )
    p.add_argument(
        "--base-url",
        default=os.environ.get("SUNROOM_BASE_URL"),
        help="endpoint for the models (default: $SUNROOM_BASE_URL)",
    )
    p.add_argument("--sub-model", help="model for predict/predict_many (default: --model)")
    p.add_argument(
        "--fake",
        action="store_true",
        help="deterministic offline models that solve the tasks by writing code",
    )
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {', '.join(ALL_TASKS)}")
    p.add_argument(
        "--embeddings",
        help="an embedding model (directory or HF repo id) bound in RLM sessions as embed/search;"
        " needed by niah-semantic",
    )
    p.add_argument(
        "--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}"
    )
    p.add_argument("--k", type=int, default=3, help="branches of rlm-best-of-k (2-64)")
    p.add_argument(
        "--choose", choices=("vote", "first"), default="vote", help="how rlm-best-of-k picks"
    )
    p.add_argument(
        "--fake-error-rate",
        type=float,
        default=0.0,
        help="with --fake: the chance that the fake root's first program is wrong",
    )
    p.add_argument(
        "--lengths",
        default=DEFAULT_LENGTHS,
        help=f"context lengths in characters, e.g. 8k,32k,1m (default {DEFAULT_LENGTHS})",
    )
    p.add_argument("--samples", type=int, default=1, help="tasks per (task, length)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="bwrap", help="kernel backend for the RLM runs")
    p.add_argument("--max-turns", type=int, default=20)
    p.add_argument("--max-model-calls", type=int, default=200, help="per RLM run")
    p.add_argument("--max-tokens", type=int, default=None, help="per RLM run")
    p.add_argument("--max-cost-micro-usd", type=int, default=None, help="per RLM run")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per baseline call and per RLM run"
    )
    p.add_argument("--json", type=Path, help="also write every outcome to this JSON file")
    return p  # fmt: skip


def _models(args: argparse.Namespace) -> tuple[Model, Model]:
    if args.fake:
        return fake_models(seed=args.seed, error_rate=args.fake_error_rate)
    root = build_model(args.model, base_url=args.base_url)
    sub = root if not args.sub_model else build_model(args.sub_model, base_url=args.base_url)
    return root, sub


async def evaluate(args: argparse.Namespace) -> list[Outcome]:
    """Run every task with every method; the caller prints the table."""
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    lengths = [_size(x) for x in args.lengths.split(",") if x.strip()]
    tasks = make_tasks(names, lengths, samples=args.samples, seed=args.seed)
    budget = Budget(
        max_model_calls=args.max_model_calls,
        max_tokens=args.max_tokens,
        max_cost_micro_usd=args.max_cost_micro_usd,
        max_wall_s=args.timeout,
    )
    root, sub = _models(args)
    embedder: Any = None
    if args.embeddings:
        from sunroom.embeddings import OnnxEmbedder

        embedder = OnnxEmbedder(args.embeddings)
    outcomes: list[Outcome] = []
    try:
        for task in tasks:
            if "baseline" in methods:
                outcomes.append(await run_baseline(task, root, timeout_s=args.timeout))
            if "rlm" in methods:
                outcomes.append(
                    await run_rlm(
                        task, root, sub, backend=args.backend, budget=budget,
                        max_turns=args.max_turns, embeddings=embedder,
                    )
                )  # fmt: skip
            if "rlm-best-of-k" in methods:
                outcomes.append(
                    await run_rlm(
                        task, root, sub, backend=args.backend, budget=budget,
                        max_turns=args.max_turns, branches=args.k, choose=args.choose,
                        embeddings=embedder,
                    )
                )  # fmt: skip
    finally:
        await root.aclose()
        if sub is not root:
            await sub.aclose()
        if embedder is not None:
            embedder.close()
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the evaluation, print the table; 0 on success, 2 on bad usage."""
    parser = _parser()
    args = parser.parse_args(argv)
    bad = [t for t in args.tasks.split(",") if t.strip() and t.strip() not in ALL_TASKS]
    bad += [m for m in args.methods.split(",") if m.strip() and m.strip() not in METHODS]
    if bad:
        parser.error(f"unknown task or method: {', '.join(bad)}")
    if not args.fake and not args.model:
        parser.error("give --model provider:name (or set SUNROOM_MODEL), or --fake")
    semantic = [t for t in args.tasks.split(",") if t.strip() in SEMANTIC_TASKS]
    if semantic and not args.embeddings:
        parser.error(f"{', '.join(semantic)} needs --embeddings MODEL (a directory or repo id)")
    if args.samples <= 0:
        parser.error("--samples must be positive")
    if not 2 <= args.k <= 64:
        parser.error("--k must be from 2 to 64")
    if not 0.0 <= args.fake_error_rate <= 1.0:
        parser.error("--fake-error-rate must be from 0 to 1")
    outcomes = asyncio.run(evaluate(args))
    if args.fake:
        models = "fake-root (sub: fake-sub)"
    else:
        models = f"{args.model} (sub: {args.sub_model or args.model})"
    print(f"rlm_eval  model: {models}  tasks: {args.tasks}  samples: {args.samples}  "
          f"seed: {args.seed}  backend: {args.backend}  best-of-k: k={args.k}, "
          f"choose={args.choose}"
          + (f"  embeddings: {args.embeddings}" if args.embeddings else ""))  # fmt: skip
    print(table(outcomes))
    failures = [o for o in outcomes if not o.correct]
    if failures:
        print("\nwrong or failed:")
        for o in failures:
            print(f"  {o.task} {_label(o.length)} #{o.sample} {o.method}: expected "
                  f"{o.expected!r}, got {o.answer[:60]!r}" + (f" ({o.error[:200]})" if o.error else ""))  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
