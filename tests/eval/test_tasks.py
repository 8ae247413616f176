"""The generated tasks: seeded, of the asked length, answerable, and scored as documented."""

from __future__ import annotations

import re

import pytest

from sunroom.eval.tasks import (
    ALL_TASKS,
    TASKS,
    callers,
    f1,
    make_task,
    make_tasks,
    pairs_of,
    score,
)

LENGTHS = (8_000, 40_000)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_every_task_is_seeded_sized_and_right_about_itself(name: str) -> None:
    for length in LENGTHS:
        for sample in range(2):
            task = make_task(name, length, sample, seed=7)
            assert task == make_task(name, length, sample, seed=7)
            assert task != make_task(name, length, sample, seed=8)
            assert task.name == name and task.length == length and task.sample == sample
            assert 0.85 * length <= len(task.context) <= 1.1 * length + 300, len(task.context)
            assert score(task, task.expected) == 1.0
            assert score(task, None) == 0.0
            assert task.expected not in task.question


def test_make_tasks_is_every_combination() -> None:
    tasks = make_tasks(["niah", "code-qa"], [8_000, 9_000], samples=3, seed=1)
    assert [(t.name, t.length, t.sample) for t in tasks][:4] == [
        ("niah", 8_000, 0), ("niah", 8_000, 1), ("niah", 8_000, 2), ("code-qa", 8_000, 0),
    ]  # fmt: skip
    assert len(tasks) == 12
    with pytest.raises(ValueError, match="unknown task"):
        make_task("nope", 8_000, 0)


def test_niah_multi_has_every_value_and_confusable_distractors() -> None:
    task = make_task("niah-multi", 20_000, 0, seed=2)
    key = re.search(r"numbers for ([a-z]+-[a-z]+)", task.question)
    assert key is not None
    a, b = key.group(1).split("-")
    values = task.expected.split(",")
    assert 2 <= len(values) <= 4
    for value in values:
        assert f"The special magic number for {a}-{b} is {value}." in task.context
    assert f"magic number for {b}-{a} is" in task.context
    assert f"magic number for {a}-{b}s is" in task.context
    assert f"special lucky number for {a}-{b} is" in task.context
    assert score(task, " and ".join(reversed(values))) == 1.0
    assert score(task, ", ".join(values[:-1])) == 0.0  # one missed
    distractor = re.search(rf"magic number for {b}-{a} is (\d+)", task.context)
    assert distractor is not None
    assert score(task, ", ".join([*values, distractor.group(1)])) == 0.0  # one too many


def test_oolong_pairs_scores_f1_over_unordered_pairs() -> None:
    task = make_task("oolong-pairs", 20_000, 0, seed=3)
    expected = pairs_of(task.expected)
    users = sorted({u for pair in expected for u in pair})
    assert 3 <= len(users) <= 7 and len(expected) == len(users) * (len(users) - 1) // 2
    for user in users:
        assert f"| user: {user} | label: urgent |" in task.context
    assert task.context.count("label: urgent") <= 2 * len(users)
    # reversed pairs and Python tuples count; half the pairs give recall 1/2, precision 1
    flipped = "\n".join(f"('{b}', '{a}')" for a, b in expected)
    assert score(task, flipped) == 1.0
    half = sorted(expected)[: len(expected) // 2]
    text = "\n".join(f"{a},{b}" for a, b in half)
    recall = len(half) / len(expected)
    assert score(task, text) == pytest.approx(2 * recall / (1 + recall))
    assert score(task, "u9999,u9998") == 0.0
    assert f1(set(), set()) == 1.0
    assert f1({("u0001", "u0002")}, set()) == 0.0


def test_code_qa_asks_about_a_call_exactly_one_definition_makes() -> None:
    for sample in range(3):
        task = make_task("code-qa", 16_000, sample, seed=4)
        callee = re.search(r"calls `(\w+)`", task.question)
        assert callee is not None
        assert callers(task.context, callee.group(1)) == [task.expected]
        assert score(task, f"It is `{task.expected}`.") == 1.0
        assert score(task, callee.group(1)) == (1.0 if callee.group(1) == task.expected else 0.0)
        if "." in task.expected:  # a method needs its class
            assert score(task, task.expected.split(".")[1]) == 0.0
        compile(task.context, "<code-qa>", "exec")  # whole definitions: the context parses


def test_the_legacy_scores_are_unchanged() -> None:
    niah, count, common = make_tasks(
        ["niah", "oolong-count", "oolong-common"], [4_000], samples=1, seed=0
    )
    assert score(niah, f"The number is {niah.expected}.") == 1.0
    assert score(count, f"{int(count.expected):,} records") == 1.0
    assert score(count, int(count.expected) + 1) == 0.0
    assert score(common, common.expected.upper()) == 1.0
    other = next(label for label in ("billing", "shipping") if label != common.expected)
    assert score(common, f"{common.expected} or {other}") == 0.0
    assert set(TASKS) < set(ALL_TASKS)


@pytest.mark.parametrize("name", TASKS)
def test_a_million_characters(name: str) -> None:
    task = make_task(name, 1_000_000, 0, seed=5)
    assert 0.9e6 <= len(task.context) <= 1.01e6
    assert score(task, task.expected) == 1.0
