"""The statistics of an evaluation: intervals for a cell's score and for the gap between arms.

* :func:`wilson`: the Wilson score interval of a proportion (k right out of n). Unlike the
  normal approximation it stays inside [0, 1] and is not zero-width at 0/n or n/n.
* :func:`bootstrap_mean`: a percentile bootstrap interval for the mean of scores in [0, 1]
  (F1), seeded, :data:`RESAMPLES` resamples by default.
* :func:`paired_difference`: the mean difference of two arms over the same items (task,
  length, seed) and its percentile bootstrap interval: resample the *items*, keep each item's
  pair together. One method for proportions and F1 alike; when every item's difference is the
  same (say both arms are right on all of them) the interval is that single value, so read it
  with its ``n``.

Every interval is two-sided at ``level`` (95% by default). Everything here is plain Python:
no numpy or scipy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Final

__all__ = ["RESAMPLES", "Interval", "bootstrap_mean", "paired_difference", "wilson"]

RESAMPLES: Final = 2000
"""Bootstrap resamples unless told otherwise (at least this many)."""


@dataclass(frozen=True, slots=True)
class Interval:
    """An estimate and its two-sided interval; ``n`` items went into it."""

    estimate: float
    low: float
    high: float
    n: int


def _z(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1, got {level!r}")
    return NormalDist().inv_cdf(0.5 + level / 2)


def wilson(successes: int, n: int, *, level: float = 0.95) -> Interval:
    """The Wilson score interval of *successes* out of *n*; n=0 gives the estimate 0 in [0, 1].

    Raises ValueError unless ``0 <= successes <= n``.
    """
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be from 0 to n, got {successes} of {n}")
    if n == 0:
        return Interval(0.0, 0.0, 1.0, 0)
    z = _z(level)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, low, high, n)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """The *q*-quantile of *sorted_values*, linear between order statistics."""
    position = q * (len(sorted_values) - 1)
    below = math.floor(position)
    above = min(below + 1, len(sorted_values) - 1)
    weight = position - below
    return sorted_values[below] * (1 - weight) + sorted_values[above] * weight


def bootstrap_mean(
    values: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """The mean of *values* and its percentile bootstrap interval (seeded: same in, same out).

    No values gives the estimate 0 in [0, 1]. Raises ValueError for fewer than
    :data:`RESAMPLES` resamples.
    """
    if resamples < RESAMPLES:
        raise ValueError(f"resamples must be at least {RESAMPLES}, got {resamples}")
    _z(level)
    n = len(values)
    if n == 0:
        return Interval(0.0, 0.0, 1.0, 0)
    mean = math.fsum(values) / n
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(values, k=n)) / n for _ in range(resamples))
    alpha = (1 - level) / 2
    return Interval(mean, _percentile(means, alpha), _percentile(means, 1 - alpha), n)


def paired_difference(
    first: Sequence[float],
    second: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Mean of ``first[i] - second[i]`` over paired items and its bootstrap interval.

    ``first[i]`` and ``second[i]`` are two arms' scores on the same item. Raises ValueError
    when the lengths differ.
    """
    if len(first) != len(second):
        raise ValueError(f"paired scores need equal lengths, got {len(first)} and {len(second)}")
    differences = [a - b for a, b in zip(first, second, strict=True)]
    if not differences:
        return Interval(0.0, -1.0, 1.0, 0)
    result = bootstrap_mean(differences, level=level, resamples=resamples, seed=seed)
    return result
