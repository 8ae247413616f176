"""Argument checks for the store's public methods: each raises UsageError with the reason.

They run on the caller's side, before any database work, so a bad argument never reaches SQL.
"""

from __future__ import annotations

import math

from sunroom.errors import UsageError
from sunroom.store.records import JSONObject, NewEvent

__all__ = ["age", "count", "event_row", "fence", "flag", "positive", "text"]


def text(value: object, label: str) -> str:
    """*value* if it is a non-empty str that UTF-8 can encode (no lone surrogates)."""
    if not isinstance(value, str) or not value:
        raise UsageError(f"{label} must be a non-empty str, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{label} is not valid Unicode: {exc}") from exc
    return value


def positive(value: object, label: str) -> float:
    """*value* as a float if it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UsageError(f"{label} must be a positive number, got {value!r}")
    if not math.isfinite(value):
        raise UsageError(f"{label} must be finite, got {value!r}")
    return float(value)


def count(value: object, label: str, *, minimum: int) -> int:
    """*value* if it is an int >= *minimum*."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{label} must be an int >= {minimum}, got {value!r}")
    return value


def event_row(event: object) -> tuple[int, str, JSONObject, float]:
    """A :class:`NewEvent`'s seq, kind, payload and ts, each checked (not the payload's JSON)."""
    if not isinstance(event, NewEvent):
        raise UsageError(f"events must be NewEvent instances, got {type(event).__name__}")
    seq = count(event.seq, "event seq", minimum=1)
    kind = text(event.kind, "event kind")
    ts = event.ts
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise UsageError(f"event ts must be a finite number, got {ts!r}")
    return seq, kind, event.payload, float(ts)


def fence(generation: object) -> int | None:
    """A write's fencing *generation* checked: None, or an int >= 0 (UsageError otherwise)."""
    return None if generation is None else count(generation, "generation", minimum=0)


def age(value: object) -> float:
    """A purge's ``older_than_s``: a finite number >= 0 (UsageError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UsageError(f"older_than_s must be a number, got {value!r}")
    if not value >= 0 or not math.isfinite(value):
        raise UsageError(f"older_than_s must be finite and >= 0, got {value!r}")
    return float(value)


def flag(value: object, label: str) -> bool:
    """*value* if it is a bool (UsageError otherwise)."""
    if not isinstance(value, bool):
        raise UsageError(f"{label} must be a bool, got {value!r}")
    return value
