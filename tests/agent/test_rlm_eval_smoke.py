"""Smoke test of benchmarks/rlm_eval.py: the offline fake solves every task both ways."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sunroom.agent import Budget
from sunroom.providers import FunctionModel, Message, ToolResultMessage, UserMessage

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rlm_eval", ROOT / "benchmarks" / "rlm_eval.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("rlm_eval", module)
    spec.loader.exec_module(module)
    return module


rlm_eval = load()


def rows(output: str) -> dict[tuple[str, str], dict[str, str]]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("length"))
    header = lines[start].split()
    table = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = dict(zip(header, line.split(), strict=True))
        table[(cells["length"], cells["method"])] = cells
    return table


def test_fake_run_prints_a_table_with_full_accuracy(capsys: pytest.CaptureFixture[str]) -> None:
    code = rlm_eval.main(["--fake", "--lengths", "2k,6k", "--backend", "subprocess", "--seed", "3"])
    assert code == 0
    out = capsys.readouterr().out
    table = rows(out)
    methods = ("baseline", "rlm", "rlm-best-of-k")
    assert set(table) == {(n, m) for n in ("2K", "6K") for m in methods}, out
    for (_, method), cells in table.items():
        assert cells["n"] == "3"  # niah, oolong-count, oolong-common
        assert float(cells["accuracy"]) == 1.0, out
        assert int(cells["in_tokens"].replace(",", "")) > 0
        assert cells["cost_uUSD"] == "unknown"  # the fakes have no price
        if method == "baseline":
            assert cells["sub_calls"] == "0.0"
        else:
            assert float(cells["sub_calls"]) > 0
    for n in ("2K", "6K"):  # three branches: three times the single run's sub-calls and tokens
        one, best = table[(n, "rlm")], table[(n, "rlm-best-of-k")]
        assert float(best["sub_calls"]) == pytest.approx(3 * float(one["sub_calls"]), abs=0.1)
    assert "wrong or failed" not in out
    assert "best-of-k: k=3, choose=vote" in out


def test_best_of_k_votes_away_a_noisy_root(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--fake", "--lengths", "4k", "--samples", "4", "--seed", "1", "--backend", "subprocess"]
    argv += ["--methods", "rlm,rlm-best-of-k", "--fake-error-rate", "0.3"]
    assert rlm_eval.main(argv) == 0
    table = rows(capsys.readouterr().out)
    single = float(table[("4K", "rlm")]["accuracy"])
    best = float(table[("4K", "rlm-best-of-k")]["accuracy"])
    assert single < 1.0 and best > single, table


async def test_rlm_run_keeps_the_context_out_of_the_prompt() -> None:
    task = rlm_eval.make_tasks(["niah"], [20_000], samples=1, seed=1)[0]
    root = FunctionModel(rlm_eval.fake_root, name="fake-root")
    sub = FunctionModel(rlm_eval.fake_sub, name="fake-sub")
    outcome = await rlm_eval.run_rlm(
        task, root, sub, backend="subprocess", budget=Budget(max_model_calls=10), max_turns=5
    )
    assert outcome.correct and outcome.sub_calls == 1, outcome
    seen: list[Message] = [m for request in root.requests for m in request.messages]
    text = "\n".join(m.content if isinstance(m, ToolResultMessage) else m.text for m in seen)
    assert task.expected not in text and task.context[:300] not in text
    assert len(text) < len(task.context)
    # The sub-model got one chunk holding the needle, not the whole context.
    (request,) = sub.requests
    chunk = request.messages[-1]
    assert isinstance(chunk, UserMessage) and task.expected in chunk.text
    assert len(chunk.text) < 5_000


def test_tasks_are_seeded_and_well_formed() -> None:
    names = ["niah", "oolong-count", "oolong-common"]
    first = rlm_eval.make_tasks(names, [8_000, 50_000], samples=2, seed=7)
    again = rlm_eval.make_tasks(names, [8_000, 50_000], samples=2, seed=7)
    assert first == again
    assert first != rlm_eval.make_tasks(names, [8_000, 50_000], samples=2, seed=8)
    for task in first:
        assert 0.9 * task.length <= len(task.context) <= 1.1 * task.length + 200
        if task.name == "niah":
            assert task.context.count("special magic number") == 1
            assert sum(ch.isdigit() for ch in task.context) == 7  # no distractor numbers
        assert rlm_eval.score(task, task.expected)


def test_scoring_and_cost_formatting() -> None:
    niah, count, common = rlm_eval.make_tasks(
        ["niah", "oolong-count", "oolong-common"], [4_000], samples=1, seed=0
    )
    assert rlm_eval.score(niah, f"The number is {niah.expected}.")
    assert not rlm_eval.score(niah, "1234567" if niah.expected != "1234567" else "7654321")
    assert rlm_eval.score(count, int(count.expected))
    assert not rlm_eval.score(count, int(count.expected) + 1)
    assert rlm_eval.score(common, common.expected.upper())
    other = next(label for label in ("billing", "shipping") if label != common.expected)
    assert not rlm_eval.score(common, f"{common.expected} or {other}")
    assert not rlm_eval.score(common, None)
    assert rlm_eval.format_cost([1_000, 2_500]) == "3,500"
    assert rlm_eval.format_cost([1_000, None]) == "unknown"


def test_usage_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUNROOM_MODEL", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        rlm_eval.main([])
    assert exit_info.value.code == 2
    assert "--model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        rlm_eval.main(["--fake", "--tasks", "nope"])
    with pytest.raises(SystemExit):
        rlm_eval.main(["--fake", "--k", "1"])
