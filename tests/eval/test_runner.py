"""sunroom.eval end to end with the deterministic fakes: files, arms, resume, budgets, failures.

Kernels are subprocess ones (fast); CI-sized settings (one length, few seeds, parallel 2).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from sunroom.errors import UsageError
from sunroom.eval import evaluate, evaluate_sync
from sunroom.eval import results as files
from sunroom.eval.arms import NO_SUB_NOTE
from sunroom.eval.fake import fake_models, fake_root
from sunroom.eval.results import Results
from sunroom.eval.tasks import TASKS
from sunroom.providers import (
    AssistantMessage,
    FunctionModel,
    Model,
    Request,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
)
from sunroom.providers.pricing import Price

FAST = "subprocess"


async def test_a_fake_evaluation_of_every_task_and_arm(tmp_path: Path) -> None:
    root, sub = fake_models()
    results = await evaluate(
        model=root, sub_model=sub, tasks=TASKS, lengths=[8_000], seeds=1, out=tmp_path,
        parallel=2, backend=FAST,
    )  # fmt: skip
    assert len(results.runs) == len(TASKS) * 4
    assert all(r.score == 1.0 and r.error is None for r in results.runs), [
        (r.task, r.arm, r.answer, r.error) for r in results.runs if r.score < 1
    ]
    # each session's first program is right: one root turn, the rest sub-calls
    assert all(r.model_calls == r.sub_calls + 1 for r in results.runs if r.arm == "rlm")
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["stopped"] is None and len(data["runs"]) == len(results.runs)
    cell = data["summary"][0]
    assert {"task", "length", "arm", "accuracy", "ci_low", "ci_high", "n"} <= set(cell)
    assert (cell["accuracy"], cell["n"]) == (1.0, 1)
    assert files.read(tmp_path / "results.json") == results
    by = {(c.task, c.arm): c for c in results.summary}
    for task in TASKS:
        assert by[(task, "long-prompt")].sub_calls == 0 and by[(task, "rlm-no-sub")].sub_calls == 0
        assert by[(task, "rlm")].sub_calls >= 1
        assert by[(task, "best-of-k")].sub_calls == 3 * by[(task, "rlm")].sub_calls
        assert by[(task, "rlm")].cost_micro_usd is None  # the fakes have no price
        share = by[(task, "rlm")].overhead_share
        assert share is not None and 0.0 < share <= 1.0
    pairs = {(p.task, p.a, p.b) for p in results.paired}
    assert ("niah", "rlm", "long-prompt") in pairs and ("niah", "best-of-k", "rlm") in pairs
    table = (tmp_path / "table.md").read_text()
    assert any(
        line.startswith("| oolong-pairs ") and "| rlm " in line and " F1 |" in line
        for line in table.splitlines()
    ), table
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def _niah(root: Model, sub: Model | None, seeds: int, out: Path, resume: bool) -> Results:
    return await evaluate(
        model=root, sub_model=sub, tasks=["niah"], lengths=[4_000], arms=["long-prompt", "rlm"],
        seeds=seeds, out=out, backend=FAST, resume=resume,
    )  # fmt: skip


def _first_turns(model: FunctionModel) -> int:
    """How many runs *model* started (requests with no earlier reply of its own)."""
    return sum(
        1 for r in model.requests if not any(isinstance(m, AssistantMessage) for m in r.messages)
    )


async def test_resume_runs_only_what_the_file_lacks(tmp_path: Path) -> None:
    root, sub = fake_models()
    full = await _niah(root, sub, 3, tmp_path, resume=False)
    # an interrupted run: two of the six runs were saved
    update = {"runs": full.runs[:2], "summary": (), "paired": (), "stopped": "interrupted"}
    files.write(tmp_path / "results.json", full.model_copy(update=update))
    with pytest.raises(UsageError, match="resume"):
        await _niah(root, sub, 3, tmp_path, resume=False)
    root, sub = fake_models()
    resumed = await _niah(root, sub, 3, tmp_path, resume=True)
    assert _first_turns(root) == 4  # the four runs left, no more
    assert [(r.key, r.score) for r in resumed.runs] == [(r.key, r.score) for r in full.runs]
    assert [(c.accuracy, c.n) for c in resumed.summary] == [(c.accuracy, c.n) for c in full.summary]
    assert resumed.stopped is None
    # more seeds on a resume: only the new ones run
    root, sub = fake_models()
    more = await _niah(root, sub, 4, tmp_path, resume=True)
    assert len(more.runs) == 8 and more.config.seeds == 4
    assert _first_turns(root) == 2
    other = FunctionModel(fake_root, name="another-model")
    with pytest.raises(UsageError, match="another model"):
        await _niah(other, None, 4, tmp_path, resume=True)


def _refused_then_solved(request: Request) -> AssistantMessage:
    """First a cell that tries predict, then one that solves the task without it."""
    system = next(m.text for m in request.messages if isinstance(m, SystemMessage))
    assert NO_SUB_NOTE in system
    if not any(isinstance(m, AssistantMessage) for m in request.messages):
        code = (
            "try:\n"
            "    predict('What is the number?', context[:100])\n"
            "except PermissionError as exc:\n"
            "    print('refused:', exc)\n"
        )
        return AssistantMessage([ToolCall("c1", "execute_code", {"code": code})])
    code = (
        "import re\n"
        "found = re.search(r'magic number for [a-z-]+ is ([0-9]+)', context)\n"
        "submit(found.group(1))"
    )
    return AssistantMessage([ToolCall("c2", "execute_code", {"code": code})])


async def test_the_no_sub_arm_refuses_predict() -> None:
    root = FunctionModel(_refused_then_solved, name="root")
    sub = FunctionModel(lambda request: "42", name="sub")
    results = await evaluate(
        model=root, sub_model=sub, tasks=["niah"], lengths=[4_000], arms=["rlm-no-sub"], seeds=1,
        backend=FAST,
    )  # fmt: skip
    (run,) = results.runs
    assert run.score == 1.0 and run.sub_calls == 0 and not sub.requests
    outputs = [m.content for m in root.requests[-1].messages if isinstance(m, ToolResultMessage)]
    assert any("refused:" in str(o) and "vetoed" in str(o) for o in outputs), outputs


async def test_best_of_k_votes_away_a_noisy_root() -> None:
    root, sub = fake_models(seed=1, error_rate=0.3)
    results = await evaluate(
        model=root, sub_model=sub, tasks=["niah"], lengths=[4_000], arms=["rlm", "best-of-k"],
        seeds=8, backend=FAST,
    )  # fmt: skip
    accuracy = {c.arm: c.accuracy for c in results.summary}
    assert accuracy["rlm"] < 1.0 and accuracy["best-of-k"] > accuracy["rlm"], accuracy
    (paired,) = results.paired
    assert (paired.a, paired.b) == ("best-of-k", "rlm") and paired.difference > 0


async def test_the_total_budget_stops_new_runs(tmp_path: Path) -> None:
    def answer(request: Request) -> str:
        return fake_root(request)  # type: ignore[return-value]  # long prompts get text

    priced = FunctionModel(answer, name="priced", price=Price(input=1000, output=1000))
    results = await evaluate(
        model=priced, tasks=["niah"], lengths=[8_000], arms=["long-prompt"], seeds=10,
        max_total_cost_micro_usd=2_000_000, out=tmp_path, backend=FAST,
    )  # fmt: skip
    assert results.stopped == "budget"
    cost = sum(r.cost_micro_usd or 0 for r in results.runs)
    assert 0 < len(results.runs) < 10 and cost >= 2_000_000
    assert all(r.cost_micro_usd for r in results.runs)
    assert files.read(tmp_path / "results.json").stopped == "budget"
    assert "unknown" not in (tmp_path / "table.md").read_text()


async def test_a_failing_model_is_a_failed_run_not_an_error() -> None:
    def broken(request: Request) -> str:
        raise RuntimeError("the model fell over")

    results = await evaluate(
        model=FunctionModel(broken, name="broken"), tasks=["niah"], lengths=[4_000],
        arms=["long-prompt", "rlm"], seeds=2, backend=FAST,
    )  # fmt: skip
    assert [r.score for r in results.runs] == [0.0] * 4
    assert all(r.error for r in results.runs)
    assert all(c.accuracy == 0.0 and c.errors == 2 for c in results.summary)


async def test_bad_arguments_are_usage_errors() -> None:
    root, _ = fake_models()
    cases: list[dict[str, Any]] = [
        {"tasks": ["nope"]},
        {"arms": ["best-of-all"]},
        {"lengths": [10]},
        {"seeds": 0},
        {"arms": ["best-of-k"], "k": 1},
        {"tasks": ["niah-semantic"]},
        {"backend": "firecracker"},
    ]
    for kwargs in cases:
        with pytest.raises(UsageError):
            await evaluate(model=root, **{"backend": FAST, **kwargs})


def test_the_sync_twin_has_the_same_signature_and_runs(tmp_path: Path) -> None:
    assert inspect.signature(evaluate_sync).parameters == inspect.signature(evaluate).parameters
    root, sub = fake_models()
    results = evaluate_sync(
        model=root, sub_model=sub, tasks=["oolong-count"], lengths=[4_000],
        arms=["long-prompt"], seeds=2, backend=FAST, plot=False, out=tmp_path,
    )  # fmt: skip
    assert [r.score for r in results.runs] == [1.0, 1.0]
    assert not (tmp_path / "plot.png").exists()


async def test_fenced_code_sessions_for_models_without_tool_calling() -> None:
    root, sub = fake_models()
    results = await evaluate(
        model=root, sub_model=sub, tasks=["oolong-count"], lengths=[4_000],
        arms=["rlm-no-sub", "rlm"], seeds=1, backend=FAST, code_tool=False,
    )  # fmt: skip
    assert [r.score for r in results.runs] == [1.0, 1.0]
    assert all(not request.tools for request in root.requests)


async def test_a_model_named_by_a_spec_is_built_with_the_output_cap(
    tmp_path: Path,
) -> None:
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["I do not know."]))
    results = await evaluate(
        model=f"scripted:{replies}", tasks=["niah"], lengths=[4_000], arms=["long-prompt"],
        seeds=1, backend=FAST, max_output_tokens=16,
    )  # fmt: skip
    (run,) = results.runs
    assert (run.answer, run.score, run.error) == ("I do not know.", 0.0, None)
    assert results.config.model == f"scripted:{replies}"
