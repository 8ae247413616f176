"""Generated long-context tasks: needle retrieval, record aggregation, pairs and code questions.

Every task is generated locally from a seed (``make_task(name, length, sample, seed=...)``), so
a run is reproducible and needs no data set; :func:`score` checks an answer (1.0 or 0.0, or an
F1 in between for ``oolong-pairs``).

* ``niah``: RULER's single-needle S-NIAH (one "special magic number" sentence hidden in
  essay-like filler at a random depth). Right when the number appears in the answer.
* ``niah-multi``: RULER's multi-value needle with confusable distractors: two to four numbers
  for one key, beside numbers for the key's words swapped (``falcon-amber``), for a key that
  shares one word, for the plural key (``amber-falcons``) and a "special lucky number" for the
  key itself. Right when the answer names exactly the key's numbers (any order).
* ``oolong-count`` / ``oolong-common``: OOLONG's aggregation over labelled records ("Record
  000123 | date: ... | user: ... | label: billing | note: ..."): how many records have label L
  (the exact integer); which label is most common (exactly that label).
* ``oolong-pairs``: OOLONG-pairs style: which pairs of users both have a record labelled
  ``urgent`` (three to seven users do, among thousands). Scored by F1 over unordered pairs.
* ``code-qa``: a question over real Python source: top-level functions and classes of
  standard-library modules (a seeded choice and order of modules, whole definitions up to the
  length), and "which function or method calls ``name``?" for a name exactly one definition
  in the context calls (found with ``ast``). Right when the answer names that definition
  (``function`` or ``Class.method``). The source is the running interpreter's standard
  library, so a task is reproducible on one Python minor version, not across them.
* ``niah-semantic`` (in :data:`SEMANTIC_TASKS`: it needs an embedder, ``--embeddings``): a
  needle worded unlike its question among eleven distractors with the same key; the efficient
  strategy is the host function ``search``.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import random
import re
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

TASKS: Final = ("niah", "niah-multi", "oolong-count", "oolong-common", "oolong-pairs", "code-qa")
"""Every task that needs nothing but a model."""
SEMANTIC_TASKS: Final = ("niah-semantic",)
"""Tasks whose efficient strategy is embedding search (they need an embedder)."""
ALL_TASKS: Final = TASKS + SEMANTIC_TASKS
F1_TASKS: Final = ("oolong-pairs",)
"""Tasks scored by F1 (a fraction); the others are right or wrong (1.0 or 0.0)."""
LEGACY_TASKS: Final = ("niah", "oolong-count", "oolong-common")
"""The tasks ``benchmarks/rlm_eval.py`` runs by default."""

# --- generated data -------------------------------------------------------------------------

_SUBJECTS = (
    "The committee", "A young engineer", "Most founders", "The old librarian", "Every gardener",
    "The visiting scholar", "A quiet neighbour", "The night editor", "Our first investor",
    "The river guide", "A patient teacher", "The village baker", "Each apprentice",
    "The museum curator", "A tired traveller", "The orchestra", "Her older brother",
)  # fmt: skip
_VERBS = (
    "considered", "rebuilt", "questioned", "described", "ignored", "rewrote", "admired",
    "carried", "measured", "postponed", "explained", "borrowed", "painted", "defended",
    "forgot", "studied", "sketched", "repaired",
)  # fmt: skip
_OBJECTS = (
    "the quarterly plan", "an unfinished essay", "the wooden bridge", "a stubborn theory",
    "the long letter", "an old map of the harbour", "the broken clock", "a list of questions",
    "the garden wall", "a forgotten recipe", "the spring schedule", "an argument about taste",
    "the narrow staircase", "a box of photographs", "the evening lecture", "the lighthouse",
)  # fmt: skip
_ENDINGS = (
    "before the winter ended", "with surprising patience", "for reasons nobody wrote down",
    "while the town slept", "after a long debate", "without asking anyone", "in the usual way",
    "as the rain kept falling", "because it seemed important", "during the short holiday",
    "with more care than before", "at the edge of the market", "until the work felt right",
    "when the light changed", "as if nothing had happened", "over several quiet weeks",
)  # fmt: skip
_KEY_WORDS = (
    "amber", "falcon", "copper", "meadow", "silver", "harbor", "violet", "canyon", "ember",
    "willow", "granite", "lantern", "cobalt", "orchid", "tundra", "saffron", "maple", "quartz",
)  # fmt: skip
_LABELS = (
    "billing",
    "shipping",
    "returns",
    "technical",
    "account",
    "feedback",
    "security",
    "pricing",
)

SEMANTIC_QUESTION = "What is the passcode of the {key} archive mentioned in the provided text?"
SEMANTIC_NEEDLE = "The lock on the {key} document store opens with the secret PIN {number}."
SEMANTIC_DISTRACTORS = (
    "The {key} lighthouse was repainted {number} times since it was built.",
    "Last season the {key} bakery sold {number} loaves of rye.",
    "The {key} ferry has carried {number} passengers across the bay.",
    "Tickets for the {key} orchestra's tour numbered {number} in all.",
    "The {key} vineyard bottled {number} bottles of white wine.",
    "The {key} marathon route is {number} millimetres long.",
    "Farmers near the {key} valley planted {number} apple trees.",
    "The {key} observatory has catalogued {number} distant stars.",
    "The {key} football club's stadium holds {number} seats after the rebuild.",
    "The {key} brewery brewed {number} litres of pale ale.",
    "The {key} zoo feeds its elephants {number} grams of hay.",
)
NIAH_QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
COUNT_QUESTION = "How many records in the provided data have the label '{label}'?"
COMMON_QUESTION = "Which label appears on the most records in the provided data?"
_NUMBER_FORMAT = "Answer with the number only."
_LABEL_FORMAT = "Answer with the label only."


@dataclass(frozen=True, slots=True)
class Task:
    """One generated task: its context, question and expected answer.

    ``expected`` is the answer as text: a number, a label, numbers joined by commas
    (``niah-multi``), one ``uXXXX,uYYYY`` pair per line (``oolong-pairs``) or a qualified name
    (``code-qa``).
    """

    name: str  # one of ALL_TASKS
    length: int  # nominal context length in characters
    sample: int
    context: str
    question: str
    answer_format: str
    expected: str

    @property
    def metric(self) -> str:
        """``"f1"`` for the tasks of :data:`F1_TASKS`, else ``"match"``."""
        return "f1" if self.name in F1_TASKS else "match"


def _sentence(rng: random.Random) -> str:
    return (
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
        f"{rng.choice(_ENDINGS)}."
    )


def _filler(rng: random.Random, length: int) -> list[str]:
    """Paragraphs of essay-like filler (no digits, no needle words) of about ``length`` chars."""
    paragraphs: list[str] = []
    size = 0
    while size < length:
        paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(3, 7)))
        paragraphs.append(paragraph)
        size += len(paragraph) + 2
    return paragraphs


def make_niah(rng: random.Random, length: int, sample: int) -> Task:
    """A haystack of ``length`` characters with one needle at a random depth."""
    key = f"{rng.choice(_KEY_WORDS)}-{rng.choice(_KEY_WORDS)}"
    number = str(rng.randint(1_000_000, 9_999_999))
    needle = f"The special magic number for {key} is {number}."
    paragraphs = _filler(rng, max(length - len(needle) - 2, 0))
    at = rng.randint(0, len(paragraphs))
    paragraphs.insert(at, needle)
    return Task(
        "niah",
        length,
        sample,
        "\n\n".join(paragraphs),
        NIAH_QUESTION.format(key=key),
        _NUMBER_FORMAT,
        number,
    )


def make_niah_semantic(rng: random.Random, length: int, sample: int) -> Task:
    """Filler of ``length`` characters holding the needle and every distractor, same key."""
    key = rng.choice(_KEY_WORDS)
    numbers = rng.sample(range(1_000_000, 10_000_000), len(SEMANTIC_DISTRACTORS) + 1)
    facts = [SEMANTIC_NEEDLE.format(key=key, number=numbers[0])] + [
        d.format(key=key, number=n) for d, n in zip(SEMANTIC_DISTRACTORS, numbers[1:], strict=True)
    ]
    size = sum(len(f) + 2 for f in facts)
    paragraphs = _filler(rng, max(length - size, 0))
    for fact in facts:
        paragraphs.insert(rng.randint(0, len(paragraphs)), fact)
    return Task(
        "niah-semantic",
        length,
        sample,
        "\n\n".join(paragraphs),
        SEMANTIC_QUESTION.format(key=key),
        _NUMBER_FORMAT,
        str(numbers[0]),
    )


def _records(rng: random.Random, length: int) -> tuple[str, Counter[str]]:
    weights = [rng.uniform(1, 8) for _ in _LABELS]
    lines: list[str] = []
    counts: Counter[str] = Counter()
    size = 0
    index = 0
    while size < length or not lines:
        label = rng.choices(_LABELS, weights)[0]
        line = (
            f"Record {index:06d} | date: 2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
            f"| user: u{rng.randint(0, 9999):04d} | label: {label} | note: {_sentence(rng)}"
        )
        lines.append(line)
        counts[label] += 1
        size += len(line) + 1
        index += 1
    (top, top_n), *rest = counts.most_common() + [("", 0)]
    if rest[0][1] == top_n:  # a tie: one more record makes the most common label unique
        lines.append(
            f"Record {index:06d} | date: 2024-01-01 | user: u0000 | label: {top} | note: "
            f"{_sentence(rng)}"
        )
        counts[top] += 1
    return "\n".join(lines), counts


def make_oolong(rng: random.Random, length: int, sample: int, name: str) -> Task:
    """Labelled records of about ``length`` characters and a counting or aggregation question."""
    context, counts = _records(rng, length)
    if name == "oolong-count":
        label = rng.choice(sorted(counts))
        return Task(
            name,
            length,
            sample,
            context,
            COUNT_QUESTION.format(label=label),
            _NUMBER_FORMAT,
            str(counts[label]),
        )
    return Task(
        name,
        length,
        sample,
        context,
        COMMON_QUESTION,
        _LABEL_FORMAT,
        counts.most_common(1)[0][0],
    )


# --- niah-multi: several values for one key, beside confusable keys ---------------------------

MULTI_QUESTION = "What are all the special magic numbers for {key} mentioned in the provided text?"
_MULTI_FORMAT = "Answer with the numbers only, separated by commas."
_MULTI_DISTRACTORS = (
    "The special magic number for {b}-{a} is {number}.",  # the key's words swapped
    "The special magic number for {a}-{other} is {number}.",  # one word shared
    "The special magic number for {other}-{b} is {number}.",
    "The special magic number for {a}-{b}s is {number}.",  # the plural key
    "The special lucky number for {a}-{b} is {number}.",  # another kind of number
)


def make_niah_multi(rng: random.Random, length: int, sample: int) -> Task:
    """Two to four needles for one key and five confusable distractors, at random depths."""
    a, b, other = rng.sample(_KEY_WORDS, 3)
    key = f"{a}-{b}"
    values = rng.randint(2, 4)
    numbers = rng.sample(range(1_000_000, 10_000_000), values + len(_MULTI_DISTRACTORS))
    facts = [f"The special magic number for {key} is {n}." for n in numbers[:values]]
    facts += [
        d.format(a=a, b=b, other=other, number=n)
        for d, n in zip(_MULTI_DISTRACTORS, numbers[values:], strict=True)
    ]
    paragraphs = _filler(rng, max(length - sum(len(f) + 2 for f in facts), 0))
    for fact in facts:
        paragraphs.insert(rng.randint(0, len(paragraphs)), fact)
    expected = ",".join(str(n) for n in sorted(numbers[:values]))
    return Task(
        "niah-multi",
        length,
        sample,
        "\n\n".join(paragraphs),
        MULTI_QUESTION.format(key=key),
        _MULTI_FORMAT,
        expected,
    )


# --- oolong-pairs: pairs of users sharing a rare label ---------------------------------------

PAIRS_LABEL = "urgent"
PAIRS_QUESTION = (
    f"Which pairs of users both have at least one record with the label '{PAIRS_LABEL}' in the "
    "provided data?"
)
_PAIRS_FORMAT = "Answer with every unordered pair once, one per line, as uXXXX,uYYYY."
_USER = re.compile(r"\bu\d{4}\b")
_PAIR = re.compile(r"\b(u\d{4})\b[^\w]+?\b(u\d{4})\b")


def make_oolong_pairs(rng: random.Random, length: int, sample: int) -> Task:
    """Labelled records with three to seven users holding one or two ``urgent`` records each."""
    context, _ = _records(rng, max(length - 1_400, length // 2))  # room for the urgent ones
    lines = context.split("\n")
    users = sorted(rng.sample(range(10_000), rng.randint(3, 7)))
    for user in users:
        for _ in range(rng.randint(1, 2)):
            line = (
                f"Record {len(lines):06d} | date: 2024-{rng.randint(1, 12):02d}-"
                f"{rng.randint(1, 28):02d} | user: u{user:04d} | label: {PAIRS_LABEL} | note: "
                f"{_sentence(rng)}"
            )
            lines.insert(rng.randint(0, len(lines)), line)
    names = [f"u{u:04d}" for u in users]
    pairs = [f"{x},{y}" for x, y in itertools.combinations(names, 2)]
    return Task(
        "oolong-pairs",
        length,
        sample,
        "\n".join(lines),
        PAIRS_QUESTION,
        _PAIRS_FORMAT,
        "\n".join(pairs),
    )


def pairs_of(answer: str) -> set[tuple[str, str]]:
    """The unordered user pairs an answer names (``u0001,u0002`` or ``('u0001', 'u0002')``)."""
    return {(min(x, y), max(x, y)) for x, y in _PAIR.findall(answer) if x != y}


def f1(predicted: set[tuple[str, str]], expected: set[tuple[str, str]]) -> float:
    """F1 of *predicted* against *expected* (0.0 when either is empty, 1.0 when both are)."""
    if not predicted and not expected:
        return 1.0
    hits = len(predicted & expected)
    if hits == 0:
        return 0.0
    precision = hits / len(predicted)
    recall = hits / len(expected)
    return 2 * precision * recall / (precision + recall)


# --- code-qa: which definition calls a name ---------------------------------------------------

CODE_MODULES: Final = (
    "argparse", "ast", "base64", "bdb", "calendar", "cmd", "codecs", "configparser",
    "contextlib", "csv", "dataclasses", "difflib", "dis", "doctest", "email.message", "enum",
    "fractions", "ftplib", "functools", "gettext", "gzip", "heapq", "http.client",
    "http.server", "imaplib", "inspect", "ipaddress", "locale", "logging", "mailbox",
    "mimetypes", "optparse", "pdb", "pickle", "platform", "pprint", "pstats", "queue",
    "random", "runpy", "sched", "selectors", "shlex", "shutil", "smtplib", "socketserver",
    "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading",
    "timeit", "tokenize", "trace", "traceback", "urllib.parse", "urllib.request", "uuid",
    "webbrowser",
)  # fmt: skip
"""Standard-library modules whose top-level definitions make ``code-qa`` contexts."""
_AST_LOCK: Final = threading.Lock()
"""Held around ``ast.parse``: on CPython 3.11 two threads parsing at once can fail with
"AST constructor recursion depth mismatch" (tasks are generated in worker threads)."""


def _parse(source: str) -> ast.Module:
    with _AST_LOCK:
        return ast.parse(source)


CODE_QUESTION = "Which function or method in the provided source code calls `{callee}`?"
_CODE_FORMAT = (
    "Answer with its qualified name only: `function` for a top-level function, "
    "`Class.method` for a method."
)


@cache
def _definitions(module: str) -> tuple[str, ...]:
    """The source of each top-level function and class of *module*, decorators included."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return ()
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    lines = source.splitlines()
    out = []
    for node in _parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            out.append("\n".join(lines[first - 1 : node.end_lineno]))
    return tuple(out)


def _called_names(node: ast.AST) -> set[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            if isinstance(sub.func, ast.Name):
                names.add(sub.func.id)
            elif isinstance(sub.func, ast.Attribute):
                names.add(sub.func.attr)
    return names


def _defined(source: str) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of each top-level function and method of *source*, in order."""
    for node in _parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield f"{node.name}.{item.name}", item


def call_graph(source: str) -> dict[str, set[str]]:
    """Qualified name (``f``, ``C.m``) of each top-level function and method -> names it calls.

    A name defined twice maps to the union of both bodies' calls. Nested functions count as
    their enclosing definition; a class body's own statements are not a definition.
    """
    graph: dict[str, set[str]] = {}
    for name, node in _defined(source):
        graph.setdefault(name, set()).update(_called_names(node))
    return graph


def callers(source: str, callee: str) -> list[str]:
    """The qualified names of the definitions in *source* that call *callee*, sorted."""
    return sorted(name for name, calls in call_graph(source).items() if callee in calls)


def make_code_qa(rng: random.Random, length: int, sample: int) -> Task:
    """A ``code-qa`` task: whole definitions of standard-library modules, and a question.

    The modules come in a seeded order; their top-level functions and classes are taken whole
    while they fit in *length* characters. The question asks which definition calls a name
    that exactly one definition (with a name defined once) calls.
    """
    modules = list(CODE_MODULES)
    rng.shuffle(modules)
    parts: list[str] = []
    size = 0
    for module in modules:
        chunks = [c for c in _definitions(module) if size + len(c) + 2 <= length]
        if not chunks:
            continue
        header = f"# --- module {module} ---"
        parts.append(header)
        size += len(header) + 1
        for chunk in _definitions(module):
            if size + len(chunk) + 2 > length:
                continue
            parts.append(chunk + "\n")
            size += len(chunk) + 2
        if size >= 0.95 * length:
            break
    context = "\n".join(parts)
    graph = call_graph(context)
    defined = Counter(name for name, _ in _defined(context))
    by_callee: dict[str, list[str]] = {}
    for name, calls in graph.items():
        for callee in calls:
            by_callee.setdefault(callee, []).append(name)
    candidates = sorted(
        callee
        for callee, names in by_callee.items()
        if len(names) == 1 and defined[names[0]] == 1 and len(callee) >= 4
        and not callee.startswith("__") and callee != names[0].rpartition(".")[2]
    )  # fmt: skip
    if not candidates:
        raise ValueError(f"no code-qa question fits in {length:,} characters; use a longer one")
    callee = rng.choice(candidates)
    return Task(
        "code-qa",
        length,
        sample,
        context,
        CODE_QUESTION.format(callee=callee),
        _CODE_FORMAT,
        by_callee[callee][0],
    )


# --- every task --------------------------------------------------------------------------------


def make_task(name: str, length: int, sample: int, *, seed: int = 0) -> Task:
    """Task *name* of about *length* characters, number *sample*, from its own seeded generator.

    The same (name, length, sample, seed) always gives the same task. Raises ValueError for an
    unknown *name* or a *length* too short for the task.
    """
    rng = random.Random(f"{seed}:{name}:{length}:{sample}")
    if name == "niah":
        return make_niah(rng, length, sample)
    if name == "niah-multi":
        return make_niah_multi(rng, length, sample)
    if name == "niah-semantic":
        return make_niah_semantic(rng, length, sample)
    if name in ("oolong-count", "oolong-common"):
        return make_oolong(rng, length, sample, name)
    if name == "oolong-pairs":
        return make_oolong_pairs(rng, length, sample)
    if name == "code-qa":
        return make_code_qa(rng, length, sample)
    raise ValueError(f"unknown task {name!r}; the tasks are {', '.join(ALL_TASKS)}")


def make_tasks(
    names: Sequence[str], lengths: Sequence[int], *, samples: int, seed: int
) -> list[Task]:
    """Every (task, length, sample), each from its own seeded generator (:func:`make_task`)."""
    return [
        make_task(name, length, sample, seed=seed)
        for length in lengths
        for name in names
        for sample in range(samples)
    ]


def score(task: Task, answer: Any) -> float:
    """How right ``answer`` is, from 0.0 to 1.0.

    ``niah``: the number appears; ``niah-semantic``: it does and no other seven-digit number
    does; ``niah-multi``: the seven-digit numbers named are exactly the key's; ``oolong-count``:
    the first integer is equal; ``oolong-common``: exactly the right label is named;
    ``oolong-pairs``: F1 of the pairs named; ``code-qa``: the qualified name appears as a word.
    """
    text = str(answer if answer is not None else "").strip()
    if task.name == "niah":
        return float(task.expected in text)
    if task.name == "niah-semantic":
        return float(re.findall(r"\d{7}", text.replace(",", "")) == [task.expected])
    if task.name == "niah-multi":
        found = set(re.findall(r"(?<!\d)\d{7}(?!\d)", text))
        return float(found == set(task.expected.split(",")))
    if task.name == "oolong-count":
        number = re.search(r"-?\d[\d,]*", text)
        return float(number is not None and number.group().replace(",", "") == task.expected)
    if task.name == "oolong-pairs":
        return f1(pairs_of(text), pairs_of(task.expected))
    if task.name == "code-qa":
        return float(re.search(rf"(?<![\w.]){re.escape(task.expected)}(?!\w)", text) is not None)
    named = [label for label in _LABELS if re.search(rf"\b{label}\b", text.lower())]
    return float(named == [task.expected])
