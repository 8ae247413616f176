"""``sunroom eval``: long-context evaluation of RLM arms with confidence intervals.

``sunroom eval --model M [--sub-model M] --tasks niah,oolong-count,... --lengths 8k,32k
--arms long-prompt,rlm-no-sub,rlm,best-of-k --seeds 30 --out DIR [--fake]`` runs
:func:`sunroom.eval.evaluate` and writes ``DIR/results.json``, ``DIR/table.md`` and
``DIR/plot.png`` (without matplotlib the plot is skipped with one line saying how to get it;
the rest is written). A progress bar with the running score and cost goes to stderr, the
table to stdout. ``--fake`` uses the deterministic offline models of
:mod:`sunroom.eval.fake`. Exit status: 0 done (wrong answers are results, not failures), 2
usage or setup error, 130 Ctrl-C (the runs so far are in ``results.json``; ``--resume``
continues). See docs/eval.md.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from sunroom.cli.support import fail, one_line
from sunroom.errors import SunroomError
from sunroom.sandbox.backends import DEFAULT_BACKEND, NAMES

if TYPE_CHECKING:
    from sunroom.providers import Model

__all__ = ["eval_command", "parse_lengths"]


def parse_lengths(text: str) -> list[int]:
    """``8k,32k,1m`` as characters; raises ValueError (one sentence) for a bad length."""
    lengths = []
    for part in (p.strip().lower().replace("_", "") for p in text.split(",")):
        if not part:
            continue
        scale = {"k": 1_000, "m": 1_000_000}.get(part[-1:], 1)
        number = part[:-1] if part[-1:] in ("k", "m") else part
        try:
            value = int(float(number) * scale)
        except ValueError:
            raise ValueError(
                f"a length is a number of characters like 8k or 1m, not {part!r}"
            ) from None
        if value <= 0:
            raise ValueError(f"a length must be positive, not {part!r}")
        lengths.append(value)
    return lengths


def _names(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def eval_command(
    model: Annotated[
        str | None,
        typer.Option(metavar="PROVIDER:NAME", help="The root model (or SUNROOM_MODEL)."),
    ] = None,
    sub_model: Annotated[
        str | None,
        typer.Option(
            metavar="PROVIDER:NAME", help="The model of predict/predict_many (default: --model)."
        ),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option(metavar="URL", help="Model endpoint (or SUNROOM_BASE_URL).")
    ] = None,
    tasks: Annotated[
        str,
        typer.Option(
            help="Comma list: niah, niah-multi, oolong-count, oolong-common, oolong-pairs, "
            "code-qa, niah-semantic."
        ),
    ] = "niah,niah-multi,oolong-count,oolong-common,oolong-pairs,code-qa",
    lengths: Annotated[
        str, typer.Option(help="Context lengths in characters, 8k to 1m.")
    ] = "8k,32k",
    arms: Annotated[
        str,
        typer.Option(help="Comma list: long-prompt, rlm-no-sub, rlm, best-of-k, dspy-rlm."),
    ] = "long-prompt,rlm-no-sub,rlm,best-of-k",
    seeds: Annotated[int, typer.Option(help="Items (seeds) per task and length.")] = 30,
    seed: Annotated[int, typer.Option(help="The base seed of every task's generator.")] = 0,
    out: Annotated[
        Path | None, typer.Option(metavar="DIR", help="Where results.json, table.md, plot.png go.")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue DIR/results.json: run only what it lacks.")
    ] = False,
    parallel: Annotated[int, typer.Option(help="Items in flight at once.")] = 1,
    k: Annotated[int, typer.Option(help="Branches of best-of-k (2-64).")] = 3,
    choose: Annotated[str, typer.Option(help="How best-of-k picks: vote or first.")] = "vote",
    backend: Annotated[
        str, typer.Option(help=f"Kernel backend of the sessions: {', '.join(NAMES)}.")
    ] = DEFAULT_BACKEND,
    max_turns: Annotated[int, typer.Option(help="Root model turns per session run.")] = 20,
    code_mode: Annotated[
        str,
        typer.Option(
            help="tool: the execute_code tool; fenced: ```python blocks, for models without "
            "tool calling (small local models)."
        ),
    ] = "tool",
    max_model_calls: Annotated[int, typer.Option(help="Model calls per session run.")] = 200,
    max_tokens: Annotated[int | None, typer.Option(help="Tokens per session run.")] = None,
    max_cost_micro_usd: Annotated[
        int | None, typer.Option(help="Cost per session run, micro-USD.")
    ] = None,
    max_total_cost_micro_usd: Annotated[
        int | None, typer.Option(help="Stop starting runs once the whole evaluation cost this.")
    ] = None,
    max_output_tokens: Annotated[
        int | None, typer.Option(help="A cap on each reply's tokens (e.g. for a base model).")
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Seconds per long-prompt call and per session run.")
    ] = 600.0,
    embeddings: Annotated[
        str | None,
        typer.Option(metavar="PATH_OR_REPO", help="An embedding model for niah-semantic."),
    ] = None,
    fake: Annotated[
        bool, typer.Option(help="Deterministic offline models that solve the tasks with code.")
    ] = False,
    fake_error_rate: Annotated[
        float, typer.Option(help="With --fake: the chance the root's first program is wrong.")
    ] = 0.0,
    plot: Annotated[bool, typer.Option(help="Write plot.png (needs matplotlib).")] = True,
    progress: Annotated[bool, typer.Option(help="The progress bar on stderr.")] = True,
) -> None:
    """Evaluate RLM arms on seeded long-context tasks, with 95% confidence intervals.

    Every (task, length, seed) item runs on every arm: long-prompt (the whole context in one
    prompt), rlm-no-sub (an RLM session whose predict/predict_many are refused), rlm, best-of-k
    (k forks of the kernel, --choose picks) and dspy-rlm (DSPy's dspy.RLM through sunroom's
    interpreter, with the dspy extra). DIR/results.json holds one row per run and a summary
    per task, length and arm (accuracy, ci_low, ci_high, n); DIR/table.md and DIR/plot.png
    show them. Ctrl-C keeps what ran; --resume continues it.
    """
    from sunroom.agent import Budget
    from sunroom.eval import evaluate
    from sunroom.eval.fake import fake_models

    if out is None:
        raise fail("give --out DIR: the directory for results.json, table.md and plot.png")
    if choose not in ("vote", "first"):
        raise fail(f"--choose is vote or first, not {choose!r}")
    if code_mode not in ("tool", "fenced"):
        raise fail(f"--code-mode is tool or fenced, not {code_mode!r}")
    if not 0.0 <= fake_error_rate <= 1.0:
        raise fail("--fake-error-rate must be from 0 to 1")
    if fake_error_rate and not fake:
        raise fail("--fake-error-rate applies to --fake only")
    try:
        lengths_list = parse_lengths(lengths)
    except ValueError as exc:
        raise fail(str(exc)) from None
    root: Model | str
    sub: Model | str | None
    if fake:
        root, sub = fake_models(seed=seed, error_rate=fake_error_rate)
    else:
        spec = model or os.environ.get("SUNROOM_MODEL")
        if not spec:
            raise fail("no model: pass --model provider:name, set SUNROOM_MODEL, or use --fake")
        root, sub = spec, sub_model
    embedder = None
    try:
        if embeddings is not None:
            from sunroom.embeddings import OnnxEmbedder

            embedder = OnnxEmbedder(embeddings)
        budget = Budget(
            max_model_calls=max_model_calls,
            max_tokens=max_tokens,
            max_cost_micro_usd=max_cost_micro_usd,
            max_wall_s=timeout,
        )
        chosen: Literal["vote", "first"] = "vote" if choose == "vote" else "first"
        results = asyncio.run(
            evaluate(
                model=root, sub_model=sub, tasks=_names(tasks), lengths=lengths_list,
                arms=_names(arms), seeds=seeds, seed=seed, out=out, resume=resume,
                parallel=parallel, k=k, choose=chosen, backend=backend, budget=budget,
                max_turns=max_turns, timeout_s=timeout,
                max_total_cost_micro_usd=max_total_cost_micro_usd,
                base_url=base_url or os.environ.get("SUNROOM_BASE_URL"), embeddings=embedder,
                progress=progress, plot=plot, code_tool=code_mode == "tool",
                max_output_tokens=max_output_tokens,
            )
        )  # fmt: skip
    except KeyboardInterrupt:
        typer.echo(
            f"sunroom: interrupted; the runs so far are in {out / 'results.json'} "
            "(add --resume to the same command to continue)",
            err=True,
        )
        raise typer.Exit(130) from None
    except SunroomError as exc:
        raise fail(one_line(exc)) from None
    finally:
        if embedder is not None:
            embedder.close()
    typer.echo((out / "table.md").read_text(encoding="utf-8"), nl=False)
    written = ["results.json", "table.md"] + (
        ["plot.png"] if (out / "plot.png").exists() and plot else []
    )
    note = f" (stopped: {results.stopped})" if results.stopped else ""
    typer.echo(
        f"\n{len(results.runs)} runs{note}; wrote {', '.join(str(out / w) for w in written)}"
    )
