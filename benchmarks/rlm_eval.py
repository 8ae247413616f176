"""Long-context evaluation: a plain long-prompt baseline beside an RLM session, per length.

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
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sunroom.agent import AsyncSession, Budget  # noqa: E402
from sunroom.providers import (  # noqa: E402
    AssistantMessage,
    FunctionModel,
    Model,
    Request,
    Settings,
    SystemMessage,
    ToolCall,
    UserMessage,
)
from sunroom.providers import model as build_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rlm_tasks import (  # noqa: E402  (generated tasks live in their own module)
    ALL_TASKS,
    SEMANTIC_TASKS,
    TASKS,
    Task,
    make_tasks,
    score,
)

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
    def of(cls, task: Task, method: str, **fields: Any) -> Outcome:
        return cls(
            task=task.name,
            length=task.length,
            sample=task.sample,
            method=method,
            expected=task.expected,
            **{"correct": False, **fields},
        )


def baseline_prompt(task: Task) -> str:
    intro = (
        "A special magic number is hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the number afterwards."
        if task.name == "niah"
        else "A passcode is hidden within the following text. Read it carefully; I will ask "
        "about it afterwards."
        if task.name == "niah-semantic"
        else "Below is a list of records. Read all of them; you will be asked about them."
    )
    return f"{intro}\n\n{task.context}\n\n{task.question} {task.answer_format}"


def rlm_task(task: Task) -> str:
    what = "text" if task.name.startswith("niah") else "records (one per line)"
    return (
        f"The variable `context` holds the {what}. {task.question} "
        f"{task.answer_format} Call submit() with the answer."
    )


async def run_baseline(task: Task, model: Model, *, timeout_s: float | None) -> Outcome:
    request = Request(
        [UserMessage(baseline_prompt(task))],
        settings=Settings(timeout=timeout_s),
    )
    start = time.perf_counter()
    try:
        response = await model.complete(request)
    except Exception as exc:
        latency = time.perf_counter() - start
        return Outcome.of(task, "baseline", latency_s=latency, error=f"{type(exc).__name__}: {exc}")
    return Outcome.of(
        task,
        "baseline",
        correct=score(task, response.text),
        answer=response.text.strip()[:200],
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        cost_micro_usd=response.cost_micro_usd,
        latency_s=time.perf_counter() - start,
        error=None if response.finish_reason in ("stop", "tool_use") else response.finish_reason,
    )


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
    method = "rlm" if branches is None else "rlm-best-of-k"
    start = time.perf_counter()
    try:
        async with AsyncSession(
            model=model,
            preset="rlm",
            sub_model=sub_model,
            backend=backend,
            inputs={"context": task.context},
            output=None,
            budget=budget,
            max_turns=max_turns,
            embeddings=embeddings,
        ) as session:
            start = time.perf_counter()  # the run itself, not the kernel's start
            result = await session.run(rlm_task(task), branches=branches, choose=choose)
    except Exception as exc:
        latency = time.perf_counter() - start
        return Outcome.of(task, method, latency_s=latency, error=f"{type(exc).__name__}: {exc}")
    return Outcome.of(
        task,
        method,
        correct=result.ok and score(task, result.output),
        answer="" if result.output is None else str(result.output)[:200],
        input_tokens=result.usage.input_tokens,
        output_tokens=result.usage.output_tokens,
        cost_micro_usd=result.cost_micro_usd,
        sub_calls=result.sub_calls,
        latency_s=time.perf_counter() - start,
        error=None if result.ok else f"{result.status}: {result.error}",
    )


# --- the fake models (--fake) -----------------------------------------------------------------

_NIAH_KEY = re.compile(r"special magic number for ([a-z]+-[a-z]+)")
_SEMANTIC_KEY = re.compile(r"passcode of the ([a-z]+) archive")
_COUNT_LABEL = re.compile(r"have the label '([a-z]+)'")
_RECORD_LABEL = re.compile(r"\| label: ([a-z]+) \|")

_NIAH_CODE = """\
import re
key = __KEY__
step = 4000
chunks = [context[i:i + step + 200] for i in range(0, len(context), step)]
hits = [chunk for chunk in chunks if "magic number for " + key in chunk]
print(len(context), "characters,", len(chunks), "chunks,", len(hits), "with the needle")
reply = predict("What is the special magic number for " + key + "? Reply with the number only.",
                hits[0])
submit(int(re.search(r"[0-9]+", reply).group()))
"""
_SEMANTIC_CODE = """\
import re
key = __KEY__
question = "What is the passcode of the " + key + " archive?"
paragraphs = [p for p in context.split("\\n\\n") if p.strip()]
hits = search(question, paragraphs, k=3)
print(len(paragraphs), "paragraphs; best:", [(h.index, round(h.score, 3)) for h in hits])
reply = predict(question + " Reply with the number only, or none.", hits[0].text)
submit(int(re.search(r"[0-9]+", reply).group()))
"""
_COUNT_CODE = """\
label = __LABEL__
lines = context.splitlines()
chunks = ["\\n".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
counts = predict_many("Count the records in this text whose label is " + repr(label)
                      + ". Reply with the count.", chunks, output=int)
print(len(lines), "records in", len(chunks), "chunks; counts per chunk:", counts[:10])
submit(sum(counts))
"""
_COMMON_CODE = """\
lines = context.splitlines()
chunks = ["\\n".join(lines[i:i + 200]) for i in range(0, len(lines), 200)]
parts = predict_many("Count the records in this text by label. Reply with a JSON object that "
                     "maps each label to its count.", chunks, output=dict[str, int])
totals = {}
for part in parts:
    for name, n in part.items():
        totals[name] = totals.get(name, 0) + n
print(totals)
submit(max(totals, key=totals.get))
"""
# Second attempts (after an error) solve the task in the kernel, without sub-calls.
_FALLBACK_CODE = {
    "niah": (
        "import re\n"
        "found = re.search('magic number for ' + re.escape(__KEY__) + ' is ([0-9]+)', context)\n"
        "submit(int(found.group(1)))"
    ),
    "niah-semantic": (
        "import re\n"
        "found = re.search('the ' + re.escape(__KEY__) + ' document store opens with the secret"
        " PIN ([0-9]+)', context)\n"
        "submit(int(found.group(1)))"
    ),
    "oolong-count": "submit(context.count('| label: ' + __LABEL__ + ' |'))",
    "oolong-common": (
        "import collections, re\n"
        "labels = re.findall(r'\\| label: ([a-z]+) \\|', context)\n"
        "submit(collections.Counter(labels).most_common(1)[0][0])"
    ),
}


def _which(question: str) -> tuple[str, dict[str, str]]:
    if (m := _NIAH_KEY.search(question)) is not None:
        return "niah", {"key": m.group(1)}
    if (m := _SEMANTIC_KEY.search(question)) is not None:
        return "niah-semantic", {"key": m.group(1)}
    if (m := _COUNT_LABEL.search(question)) is not None:
        return "oolong-count", {"label": m.group(1)}
    return "oolong-common", {}


def _solve(kind: str, params: dict[str, str], text: str) -> str:
    """What the fake reads off a text it was given whole."""
    if kind == "niah":
        found = re.search(rf"magic number for {params['key']} is (\d+)", text)
        return found.group(1) if found else "I could not find it."
    if kind == "niah-semantic":
        pattern = rf"the {params['key']} document store opens with the secret PIN (\d+)"
        found = re.search(pattern, text)
        return found.group(1) if found else "none"
    labels = Counter(_RECORD_LABEL.findall(text))
    if kind == "oolong-count":
        return str(labels[params["label"]])
    return labels.most_common(1)[0][0] if labels else "none"


# Wrong first programs (--fake-error-rate): each changes the last line to a plausible bug.
_WRONG_SUBMIT = {
    "niah": 'submit(int(re.search(r"[0-9]+", reply).group()[::-1]))',  # digits reversed
    "niah-semantic": 'submit(int(re.search(r"[0-9]+", reply).group()[::-1]))',
    "oolong-count": "submit(sum(counts) + 1)",  # off by one
    "oolong-common": "submit(min(totals, key=totals.get))",  # the rarest label
}


def fake_root(request: Request, *, wrong: bool = False) -> str | AssistantMessage:
    """The fake root model: answers a long prompt directly, or acts through code in a session.

    *wrong*: its first program in a session has a bug (the submit line of ``_WRONG_SUBMIT``).
    """
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    if not any(tool.name == "execute_code" for tool in request.tools):
        kind, params = _which(users[-1].text[-400:])  # baseline: the question ends the prompt
        return _solve(kind, params, users[-1].text)
    kind, params = _which(users[0].text)
    attempts = sum(1 for m in request.messages if isinstance(m, AssistantMessage))
    if attempts >= 2:
        return "I could not solve it."
    template = {
        "niah": _NIAH_CODE,
        "niah-semantic": _SEMANTIC_CODE,
        "oolong-count": _COUNT_CODE,
        "oolong-common": _COMMON_CODE,
    }
    code = template[kind] if attempts == 0 else _FALLBACK_CODE[kind]
    if wrong and attempts == 0:
        code = code.rstrip().rsplit("\n", 1)[0] + "\n" + _WRONG_SUBMIT[kind] + "\n"
    for name, value in params.items():
        code = code.replace(f"__{name.upper()}__", repr(value))
    return AssistantMessage([ToolCall(f"call_{attempts + 1}", "execute_code", {"code": code})])


def fake_sub(request: Request) -> str:
    """The fake sub-model: reads the instructions and its input, and answers from the input."""
    system = next(m.text for m in request.messages if isinstance(m, SystemMessage))
    text = request.messages[-1].text if isinstance(request.messages[-1], UserMessage) else ""
    if (m := _NIAH_KEY.search(system)) is not None:
        return _solve("niah", {"key": m.group(1)}, text)
    if (m := _SEMANTIC_KEY.search(system)) is not None:
        return _solve("niah-semantic", {"key": m.group(1)}, text)
    labels = Counter(_RECORD_LABEL.findall(text))
    if (m := re.search(r"whose label is '([a-z]+)'", system)) is not None:
        value: Any = labels[m.group(1)]
    else:
        value = dict(labels)
    return json.dumps({"value": value}) if request.output_schema is not None else str(value)


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


def format_cost(costs: Sequence[int | None]) -> str:
    """Total micro-USD, or "unknown" when any cost is unknown."""
    if not costs or any(c is None for c in costs):
        return "unknown"
    return f"{sum(c for c in costs if c is not None):,}"


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
        draw = random.Random(args.seed)
        rate = args.fake_error_rate

        def root(request: Request) -> str | AssistantMessage:
            first = not any(isinstance(m, AssistantMessage) for m in request.messages)
            return fake_root(request, wrong=first and draw.random() < rate)

        return FunctionModel(root, name="fake-root"), FunctionModel(fake_sub, name="fake-sub")
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
