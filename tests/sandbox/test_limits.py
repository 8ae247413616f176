"""Limits refuses numbers no kernel could run under, with one sentence naming the field."""

from __future__ import annotations

import pytest

from sunroom import Limits, UsageError
from sunroom.sandbox.limits import MIN_PIDS


@pytest.mark.parametrize("pids", [1, MIN_PIDS - 1])
def test_pids_below_the_floor_are_refused(pids: int) -> None:
    with pytest.raises(UsageError, match=rf"Limits.pids must be at least {MIN_PIDS}") as info:
        Limits(pids=pids)
    assert "\n" not in str(info.value)


def test_pids_at_the_floor_are_accepted() -> None:
    assert Limits(pids=MIN_PIDS).pids == MIN_PIDS


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", 0),
        ("memory_mb", -1),
        ("open_files", float("nan")),
        ("pids", 0),
        ("pids", True),
    ],
)
def test_non_positive_or_non_numbers_are_refused(field: str, value: object) -> None:
    with pytest.raises(UsageError, match=rf"Limits.{field} must be a positive finite number"):
        Limits(**{field: value})  # type: ignore[arg-type]
