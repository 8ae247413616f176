"""Summary rows, paired differences, the markdown table, the plot and the progress bar."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sunroom.eval import results as files
from sunroom.eval.report import format_cost, label, markdown, plot, summarize
from sunroom.eval.results import Config, Results, Run
from sunroom.eval.runner import Progress
from sunroom.eval.stats import bootstrap_mean, wilson


def _run(arm: str, seed: int, score: float, **fields: object) -> Run:
    return Run.model_validate(
        {"task": "niah", "length": 8_000, "seed": seed, "arm": arm, "score": score, **fields}
    )


def test_a_cell_is_the_wilson_interval_and_the_means() -> None:
    runs = [_run("rlm", s, 1.0 if s < 12 else 0.0, wall_s=2.0, model_s=1.5, sub_calls=3,
                 input_tokens=100, cost_micro_usd=10) for s in range(30)]  # fmt: skip
    (cell,), paired = summarize(runs)
    expected = wilson(12, 30)
    assert (cell.accuracy, cell.ci_low, cell.ci_high, cell.n) == (
        expected.estimate, expected.low, expected.high, 30,
    )  # fmt: skip
    assert cell.input_tokens == 100 and cell.sub_calls == 3 and cell.cost_micro_usd == 300
    assert cell.wall_s == 2.0 and cell.overhead_s == 0.5 and cell.overhead_share == 0.25
    assert paired == []


def test_f1_cells_bootstrap_and_unknown_costs_stay_unknown() -> None:
    scores = [0.5, 1.0, 0.8, 0.0, 0.25]
    runs = [_run("rlm", s, v, metric="f1", cost_micro_usd=None if s == 2 else 5)
            for s, v in enumerate(scores)]  # fmt: skip
    (cell,), _ = summarize(runs, seed=9)
    interval = bootstrap_mean(scores, seed=9)
    assert (cell.metric, cell.accuracy, cell.ci_low, cell.ci_high) == (
        "f1", interval.estimate, interval.low, interval.high,
    )  # fmt: skip
    assert cell.cost_micro_usd is None
    assert "unknown" in markdown([cell], [])


def test_pairs_use_the_seeds_both_arms_ran() -> None:
    runs = [_run("long-prompt", s, 0.0) for s in range(5)]
    runs += [_run("rlm", s, 1.0) for s in range(3)]  # seeds 3 and 4 missing
    runs += [_run("rlm-no-sub", s, 1.0) for s in range(5)]
    cells, paired = summarize(runs)
    assert [c.arm for c in cells] == ["long-prompt", "rlm-no-sub", "rlm"]
    got = {(p.a, p.b): p for p in paired}
    assert set(got) == {
        ("rlm-no-sub", "long-prompt"),
        ("rlm", "long-prompt"),
        ("rlm", "rlm-no-sub"),
    }
    assert got[("rlm", "long-prompt")].n == 3
    assert got[("rlm", "long-prompt")].difference == 1.0
    assert got[("rlm", "rlm-no-sub")].difference == 0.0


def test_the_markdown_table() -> None:
    runs = [_run(arm, s, 1.0) for arm in ("long-prompt", "rlm") for s in range(4)]
    cells, paired = summarize(runs)
    text = markdown(cells, paired, title="t")
    lines = text.splitlines()
    assert lines[0] == "# t"
    assert lines[2].startswith("| task ") and "accuracy [95% CI]" in lines[2]
    assert lines[4].startswith("| niah | 8K     | long-prompt | 4 | 1.00 [0.51, 1.00] |")
    assert "| niah | 8K     | rlm | long-prompt | 4 | +0.00 [+0.00, +0.00] |" in text
    assert label(1_000_000) == "1M" and label(32_000) == "32K" and label(2_500) == "2500"
    assert format_cost([1_000, 2_500]) == "3,500" and format_cost([1, None]) == "unknown"


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    runs = [_run(arm, s, float(s % 2)) for arm in ("rlm", "best-of-k") for s in range(6)]
    runs += [r.model_copy(update={"length": 32_000}) for r in runs]
    cells, _ = summarize(runs)
    plot(cells, tmp_path / "plot.png", title="t")
    assert (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"


def test_the_results_file_round_trips_and_refuses_other_files(tmp_path: Path) -> None:
    config = Config(model="m", sub_model="m", tasks=("niah",), lengths=(8_000,), arms=("rlm",),
                    seeds=2)  # fmt: skip
    results = Results(config=config, runs=(_run("rlm", 0, 1.0, wall_s=1.0, model_s=0.25),))
    files.write(tmp_path / "results.json", results)
    assert files.read(tmp_path / "results.json") == results
    assert results.runs[0].overhead_s == 0.75
    (tmp_path / "other.json").write_text('{"runs": 3}')
    with pytest.raises(ValueError, match="not a sunroom eval results file"):
        files.read(tmp_path / "other.json")
    with pytest.raises(ValueError, match="cannot read"):
        files.read(tmp_path / "missing.json")


def test_the_progress_bar_without_a_terminal_writes_a_line_per_tenth() -> None:
    out = io.StringIO()
    bar = Progress(20, out)
    for s in range(20):
        bar.update(_run("rlm", s, 1.0 if s % 2 else 0.0, cost_micro_usd=None if s == 0 else 100))
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[-1].startswith(
        "[########################] 20/20 runs  score 0.50  cost 1,900 µUSD (+1 unpriced)"
    )
