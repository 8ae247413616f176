"""Generated long-context tasks for ``rlm_eval.py``: needle retrieval and record aggregation.

``niah`` follows RULER's single-needle S-NIAH (one "special magic number" sentence hidden in
essay-like filler); ``oolong-count`` and ``oolong-common`` follow OOLONG's aggregation tasks over
labelled records. ``niah-semantic`` (in :data:`SEMANTIC_TASKS`, run only with embeddings) hides
a needle that shares no wording with the question but its key: the question asks for the
*passcode of the <key> archive*, the needle says that *the lock on the <key> document store
opens with the secret PIN <n>*, and eleven distractors name the same key with other numbers
(the <key> lighthouse, bakery, ferry ...). Matching the key finds every one of them; embedding
similarity (``search``) ranks the needle first. Everything is generated locally from a seed;
:func:`score` checks an answer.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TASKS = ("niah", "oolong-count", "oolong-common")
SEMANTIC_TASKS = ("niah-semantic",)
"""Tasks whose efficient strategy is embedding search (``rlm_eval.py --embeddings``)."""
ALL_TASKS = TASKS + SEMANTIC_TASKS

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
    """One generated task: its context, question and expected answer."""

    name: str  # one of TASKS
    length: int  # nominal context length in characters
    sample: int
    context: str
    question: str
    answer_format: str
    expected: str


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


def make_tasks(
    names: Sequence[str], lengths: Sequence[int], *, samples: int, seed: int
) -> list[Task]:
    """Every (task, length, sample), each from its own seeded generator."""
    tasks = []
    for length in lengths:
        for name in names:
            for sample in range(samples):
                rng = random.Random(f"{seed}:{name}:{length}:{sample}")
                if name == "niah":
                    tasks.append(make_niah(rng, length, sample))
                elif name == "niah-semantic":
                    tasks.append(make_niah_semantic(rng, length, sample))
                else:
                    tasks.append(make_oolong(rng, length, sample, name))
    return tasks


def score(task: Task, answer: Any) -> bool:
    """Whether ``answer`` is right: the number appears (niah; niah-semantic: and no other
    seven-digit number does), the integer is equal (count), exactly the right label is named
    (common)."""
    text = str(answer if answer is not None else "").strip()
    if task.name == "niah":
        return task.expected in text
    if task.name == "niah-semantic":
        return re.findall(r"\d{7}", text.replace(",", "")) == [task.expected]
    if task.name == "oolong-count":
        found = re.search(r"-?\d[\d,]*", text)
        return found is not None and found.group().replace(",", "") == task.expected
    named = [label for label in _LABELS if re.search(rf"\b{label}\b", text.lower())]
    return named == [task.expected]
