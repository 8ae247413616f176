"""The dspy-rlm arm: DSPy's own dspy.RLM, through sunroom's interpreter, on sunroom's models."""

from __future__ import annotations

import pytest

pytest.importorskip("dspy")

from sunroom.eval import TASKS, evaluate  # noqa: E402
from sunroom.eval.fake import fake_models  # noqa: E402
from sunroom.eval.tasks import make_task  # noqa: E402
from sunroom.providers import (  # noqa: E402
    FunctionModel,
    Request,
    SystemMessage,
    ToolResultMessage,
    UserMessage,
)
from sunroom.providers.pricing import Price  # noqa: E402


async def test_dspy_rlm_solves_every_task_on_the_same_fake_models() -> None:
    root, sub = fake_models()
    results = await evaluate(
        model=root, sub_model=sub, tasks=TASKS, lengths=[8_000], arms=["rlm", "dspy-rlm"],
        seeds=1, backend="subprocess", parallel=2,
    )  # fmt: skip
    dspy_runs = [r for r in results.runs if r.arm == "dspy-rlm"]
    assert len(dspy_runs) == len(TASKS)
    for run in dspy_runs:
        assert run.score == 1.0 and run.error is None, run
        assert run.sub_calls >= 1 and run.model_calls == run.sub_calls + 1
        assert run.input_tokens > 0 and run.cost_micro_usd is None
    # DSPy's requests went to the very model objects the sessions used, without the context
    dspy_requests = [
        r for r in root.requests
        if any(isinstance(m, SystemMessage) and "[[ ## code ## ]]" in m.text for m in r.messages)
    ]  # fmt: skip
    assert len(dspy_requests) == len(TASKS)
    task = make_task("niah", 8_000, 0)
    for request in dspy_requests:
        text = "\n".join(m.text for m in request.messages if not isinstance(m, ToolResultMessage))
        assert task.context[1_000:2_000] not in text
    assert ("niah", "dspy-rlm", "rlm") in {(p.task, p.a, p.b) for p in results.paired}


async def test_dspy_rlm_counts_cost_and_a_failing_model_is_a_failed_run() -> None:
    root, sub = fake_models()
    price = Price(input=1, output=2)  # micro-USD per token
    priced_sub = FunctionModel(sub.function, name="priced-sub", price=price)
    results = await evaluate(
        model=root, sub_model=priced_sub, tasks=["oolong-count"], lengths=[4_000],
        arms=["dspy-rlm"], seeds=1, backend="subprocess",
    )  # fmt: skip
    (run,) = results.runs
    assert run.score == 1.0
    assert run.cost_micro_usd is None  # the root has no price: the total is unknown
    priced_root = FunctionModel(root.function, name="priced-root", price=price)
    results = await evaluate(
        model=priced_root, sub_model=priced_sub, tasks=["oolong-count"], lengths=[4_000],
        arms=["dspy-rlm"], seeds=1, backend="subprocess",
    )  # fmt: skip
    (run,) = results.runs
    assert run.cost_micro_usd == run.input_tokens + 2 * run.output_tokens

    def broken(request: Request) -> str:
        assert isinstance(request.messages[-1], UserMessage)
        raise RuntimeError("the model fell over")

    results = await evaluate(
        model=FunctionModel(broken, name="broken"), tasks=["niah"], lengths=[4_000],
        arms=["dspy-rlm"], seeds=1, backend="subprocess",
    )  # fmt: skip
    (run,) = results.runs
    assert run.score == 0.0 and run.error is not None and "fell over" in run.error
