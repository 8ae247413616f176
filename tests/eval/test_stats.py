"""The intervals of sunroom.eval.stats against closed forms, a published table and simulation."""

from __future__ import annotations

import math
import random

import pytest

from sunroom.eval.stats import RESAMPLES, bootstrap_mean, paired_difference, wilson

Z95 = 1.959963984540054  # the 0.975 quantile of the standard normal


def wilson_by_quadratic(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson interval as the roots of (p_hat - p)^2 = z^2 p (1 - p) / n, solved for p."""
    p_hat = k / n
    a = 1 + z * z / n
    b = -(2 * p_hat + z * z / n)
    c = p_hat * p_hat
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


@pytest.mark.parametrize(("k", "n"), [(0, 30), (15, 30), (30, 30), (81, 263), (1, 29), (7, 10)])
def test_wilson_is_the_closed_form(k: int, n: int) -> None:
    low, high = wilson_by_quadratic(k, n)
    got = wilson(k, n)
    assert got.estimate == pytest.approx(k / n)
    assert got.low == pytest.approx(max(low, 0.0), abs=1e-12)
    assert got.high == pytest.approx(min(high, 1.0), abs=1e-12)
    assert got.n == n


def test_wilson_at_the_edges() -> None:
    # 0/30: the interval starts at 0 and ends at z^2 / (n + z^2); 30/30 mirrors it.
    assert wilson(0, 30).low == 0.0
    assert wilson(0, 30).high == pytest.approx(Z95**2 / (30 + Z95**2))
    assert wilson(30, 30).high == 1.0
    assert wilson(30, 30).low == pytest.approx(30 / (30 + Z95**2))
    # 15/30: symmetric about one half
    half = wilson(15, 30)
    assert half.low + half.high == pytest.approx(1.0)
    assert (round(half.low, 4), round(half.high, 4)) == (0.3315, 0.6685)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611),
     (1, 29, 0.0061, 0.1718), (29, 29, 0.8830, 1.0)],
)  # fmt: skip
def test_wilson_matches_newcombe_1998(k: int, n: int, low: float, high: float) -> None:
    """Newcombe, Statistics in Medicine 17 (1998) 857-872, Table II, method 3 (Wilson score)."""
    got = wilson(k, n)
    assert (round(got.low, 4), round(got.high, 4)) == (low, high)


def test_wilson_levels_and_bad_input() -> None:
    assert wilson(15, 30, level=0.99).low < wilson(15, 30).low < wilson(15, 30, level=0.8).low
    assert wilson(0, 0).low == 0.0 and wilson(0, 0).high == 1.0
    with pytest.raises(ValueError, match="successes must be from 0 to n"):
        wilson(31, 30)
    with pytest.raises(ValueError, match="level must be between 0 and 1"):
        wilson(1, 3, level=1.0)


def test_bootstrap_is_seeded_and_near_the_normal_interval() -> None:
    rng = random.Random(5)
    values = [rng.random() for _ in range(200)]
    first = bootstrap_mean(values, seed=3)
    assert first == bootstrap_mean(values, seed=3)
    assert first != bootstrap_mean(values, seed=4)
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = Z95 * sd / math.sqrt(len(values))
    assert first.estimate == pytest.approx(mean)
    assert first.low == pytest.approx(mean - half, abs=0.25 * half)
    assert first.high == pytest.approx(mean + half, abs=0.25 * half)


def test_bootstrap_of_equal_values_and_of_none() -> None:
    same = bootstrap_mean([0.5] * 30)
    assert (same.estimate, same.low, same.high) == (0.5, 0.5, 0.5)
    empty = bootstrap_mean([])
    assert (empty.low, empty.high, empty.n) == (0.0, 1.0, 0)
    with pytest.raises(ValueError, match="resamples must be at least 2000"):
        bootstrap_mean([1.0, 0.0], resamples=RESAMPLES - 1)


def test_bootstrap_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(11)
    covered = 0
    trials = 200
    for trial in range(trials):
        values = [1.0 if rng.random() < 0.3 else rng.random() * 0.6 for _ in range(40)]
        interval = bootstrap_mean(values, seed=trial)
        covered += interval.low <= 0.3 + 0.7 * 0.3 <= interval.high
    assert 0.88 <= covered / trials <= 0.99


def test_paired_difference() -> None:
    better = [1.0] * 20 + [0.0] * 10
    worse = [0.0] * 10 + [1.0] * 10 + [0.0] * 10
    got = paired_difference(better, worse, seed=1)
    assert got.estimate == pytest.approx(10 / 30)
    assert 0.0 < got.low < got.estimate < got.high <= 1.0
    assert got.n == 30
    # the pairing matters: the same marginals, paired so that the arms disagree more, give a
    # wider interval (20 items +1 and 10 items -1 rather than 10 items +1 and 20 ties)
    shuffled = paired_difference(better, [0.0] * 20 + [1.0] * 10, seed=1)
    assert shuffled.estimate == pytest.approx(got.estimate)
    assert shuffled.high - shuffled.low > got.high - got.low
    same = paired_difference([1.0, 0.0, 1.0], [1.0, 0.0, 1.0])
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)
    assert paired_difference([], []).n == 0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference([1.0], [1.0, 0.0])
