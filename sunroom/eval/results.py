"""The results file of an evaluation (``DIR/results.json``): its pydantic models, read and write.

The file is one JSON object (schema version :data:`SCHEMA_VERSION`):

* ``config``: what was run (:class:`Config`): models, tasks, lengths, arms, seeds, best-of-k;
  ``--resume`` refuses a file whose config differs from the command's;
* ``runs``: one object per (task, length, seed, arm) run (:class:`Run`), for re-analysis;
* ``summary``: one row per (task, length, arm) (:class:`Cell`): ``accuracy``, ``ci_low``,
  ``ci_high``, ``n`` and the means of cost, tokens, sub-calls, time and overhead;
* ``paired``: one row per (task, length) and pair of arms (:class:`Paired`): the mean paired
  difference and its interval.

``summary`` and ``paired`` are computed from ``runs`` (:func:`sunroom.eval.report.summarize`);
the file is rewritten whole (atomically) after every finished run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Final, Literal

import pydantic

__all__ = ["SCHEMA_VERSION", "Cell", "Config", "Paired", "Results", "Run", "read", "write"]

SCHEMA_VERSION: Final = 1


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")


class Run(_Model):
    """One arm on one task.

    ``score`` is 1.0 or 0.0 (``metric`` ``match``) or an F1 (``f1``); a run that failed
    (``error`` set) scores 0. ``cost_micro_usd`` is None when a price is unknown. Times in
    seconds: ``wall_s`` the run, ``startup_s`` the kernel's start before it (sessions),
    ``model_s`` the time a model call was in flight, ``overhead_s`` = ``wall_s - model_s``.
    """

    task: str
    length: int
    seed: int
    arm: str
    metric: Literal["match", "f1"] = "match"
    score: float = 0.0
    expected: str = ""
    answer: str = ""
    status: str = "error"
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micro_usd: int | None = None
    model_calls: int = 0
    sub_calls: int = 0
    wall_s: float = 0.0
    startup_s: float = 0.0
    model_s: float = 0.0
    overhead_s: float = 0.0
    """Wall time not spent waiting on a model; filled from ``wall_s - model_s`` when absent."""
    error: str | None = None

    @pydantic.model_validator(mode="before")
    @classmethod
    def _overhead(cls, data: object) -> object:
        if isinstance(data, dict) and "overhead_s" not in data:
            wall = float(data.get("wall_s", 0.0))
            model = float(data.get("model_s", 0.0))
            return {**data, "overhead_s": max(wall - model, 0.0)}
        return data

    @property
    def key(self) -> tuple[str, int, int, str]:
        """(task, length, seed, arm): what identifies the run in a results file."""
        return (self.task, self.length, self.seed, self.arm)


class Config(_Model):
    """What an evaluation ran: ``--resume`` continues only a file with the same config."""

    model: str
    sub_model: str
    tasks: tuple[str, ...]
    lengths: tuple[int, ...]
    arms: tuple[str, ...]
    seeds: int
    seed: int = 0
    k: int = 3
    choose: str = "vote"


class Cell(_Model):
    """One (task, length, arm): the score's mean and interval, and the means of the rest.

    ``accuracy`` is the share right (Wilson interval) for ``match`` tasks and the mean F1
    (bootstrap interval) for ``f1`` ones. ``cost_micro_usd`` is the total, None when unknown.
    ``overhead_share`` is the summed overhead over the summed wall time.
    """

    task: str
    length: int
    arm: str
    metric: Literal["match", "f1"]
    accuracy: float
    ci_low: float
    ci_high: float
    n: int
    errors: int
    input_tokens: float
    output_tokens: float
    cost_micro_usd: int | None
    sub_calls: float
    wall_s: float
    startup_s: float
    model_s: float
    overhead_s: float
    overhead_share: float | None


class Paired(_Model):
    """Arm ``a`` minus arm ``b`` on the items (task, length, seed) both ran."""

    task: str
    length: int
    a: str
    b: str
    difference: float
    ci_low: float
    ci_high: float
    n: int


class Results(_Model):
    """The whole results file."""

    schema_version: int = SCHEMA_VERSION
    config: Config
    runs: tuple[Run, ...] = ()
    summary: tuple[Cell, ...] = ()
    paired: tuple[Paired, ...] = ()
    stopped: str | None = None
    """Why the evaluation stopped before every run was done (None: it was not stopped)."""


def read(path: Path) -> Results:
    """The results file at *path*. Raises ValueError (one sentence) when it is not one."""
    try:
        return Results.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except pydantic.ValidationError:
        raise ValueError(f"{path} is not a sunroom eval results file") from None


def write(path: Path, results: Results) -> None:
    """Write *results* to *path* atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide results from the rest of a team
        with os.fdopen(fd, "wb") as f:
            f.write(results.model_dump_json(indent=1).encode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
