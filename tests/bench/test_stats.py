"""The statistics every bench reports: nearest-rank percentiles, spreads, paired rounds, targets."""

from __future__ import annotations

import math

import pytest

from bench.stats import (
    SMALL_N,
    UNEXPLAINED,
    compare,
    per_round,
    percentile,
    rounded,
    samples_for_a_real_tail,
    summarize,
    tail,
    target,
)


@pytest.mark.parametrize(
    ("q", "expected"),
    [(0.0, 1), (0.1, 1), (0.11, 2), (0.5, 5), (0.9, 9), (0.91, 10), (0.99, 10), (1.0, 10)],
)
def test_percentiles_are_nearest_rank_observations(q: float, expected: int) -> None:
    assert percentile([7, 3, 10, 1, 5, 2, 9, 4, 8, 6], q) == expected


def test_percentile_refuses_nothing_and_out_of_range() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        percentile([1.0], 1.5)


def test_small_samples_report_min_and_max_large_ones_p10_and_p90() -> None:
    small = summarize([3.0, 1.0, 2.0], "ms")
    assert small == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3, "unit": "ms", "samples": [3.0, 1.0, 2.0]}
    values = [float(v) for v in range(1, SMALL_N + 11)]  # 1..20
    large = summarize(values, "tok/s")
    assert (large["median"], large["p10"], large["p90"], large["n"]) == (10.5, 2.0, 18.0, 20)
    assert "min" not in large and "max" not in large and large["samples"] == values


def test_no_samples_is_a_median_of_none_not_an_error() -> None:
    assert summarize([], "ms") == {"median": None, "n": 0, "unit": "ms", "samples": []}


def test_per_round_ratios_pair_sample_i_with_sample_i() -> None:
    assert per_round([10, 30, 8], [5, 10, 8], "ratio") == ([2.0, 3.0, 1.0], 0)
    assert per_round([10, 30, 8], [5, 10, 8], "difference") == ([5, 20, 0], 0)
    with pytest.raises(ValueError, match="unpaired"):
        per_round([1, 2], [1], "ratio")


def test_a_zero_denominator_is_counted_and_reported_never_dropped_silently() -> None:
    assert per_round([10, 4, 8], [5, 0, 0], "ratio") == ([2.0], 2)
    compared = compare([10.0, 4.0, 8.0], [5.0, 0.0, 0.0], "ratio", "a / b")
    assert (compared["median"], compared["n"], compared["rounds"], compared["zero_denominators"]) == (2.0, 1, 3, 2)
    nothing = compare([1.0], [0.0], "ratio", "a / b")
    assert nothing["median"] is None and nothing["zero_denominators"] == 1 and nothing["rounds"] == 1


def test_the_median_of_per_round_ratios_is_not_the_ratio_of_medians() -> None:
    """Drift that hits both sides of a round cancels in its ratio; medians taken apart do not pair."""
    a, b = [100.0, 50.0, 200.0], [50.0, 25.0, 100.0]  # each round: a is twice b, whatever the drift
    compared = compare(a, b, "ratio", "a / b")
    assert compared["median"] == 2.0 and compared["min"] == compared["max"] == 2.0
    assert compared["of"] == "a / b" and compared["unit"] == "x"
    assert compare([12.0, 15.0], [10.0, 10.0], "difference", "a - b", "ms")["median"] == 3.5


@pytest.mark.parametrize(
    ("value", "bound", "limit", "met"),
    [
        (0.96, ">=", 0.95, True),
        (0.95, ">=", 0.95, True),
        (0.94, ">=", 0.95, False),
        (16.0, "<=", 15, False),
        (0, "==", 0, True),
        (1, "==", 0, False),
        (None, ">=", 0.95, False),
        (math.nan, "<=", 15, False),
    ],
)
def test_targets_are_judged_and_stated(value: float | None, bound: str, limit: float, met: bool) -> None:
    judged = target(value, bound, limit, "ms")  # pyright: ignore[reportArgumentType]
    assert judged["target"] == f"{bound} {limit:g} ms" and judged["value"] is value and judged["met"] is met
    assert ("note" in judged) is (not met)


def test_a_missed_target_says_what_bounds_it_or_that_the_bench_has_no_account() -> None:
    assert target(0.8, ">=", 0.95, bounded_by="two ranks share two cores")["note"] == "two ranks share two cores"
    assert target(0.8, ">=", 0.95)["note"] == UNEXPLAINED
    assert "note" not in target(0.99, ">=", 0.95, bounded_by="two ranks share two cores")


def test_a_p99_of_fewer_than_100_samples_says_it_is_the_maximum() -> None:
    assert samples_for_a_real_tail(0.99) == 100 and samples_for_a_real_tail(0.9) == 10
    assert tail([float(v) for v in range(99)], 0.99) == {
        "value": 98.0,
        "is_max": True,
        "n": 99,
        "n_for_a_real_tail": 100,
    }
    hundred = tail([float(v) for v in range(100)], 0.99)
    assert hundred["value"] == 98.0 and hundred["is_max"] is False
    assert tail([], 0.99)["value"] is None and tail([], 0.99)["is_max"] is True


@pytest.mark.parametrize(
    ("value", "expected"), [(153218.4, 153218.0), (0.97094, 0.9709), (7.0791, 7.079), (0.0, 0.0), (-3.14159, -3.142)]
)
def test_rounded_keeps_four_significant_digits_and_whole_numbers_whole(value: float, expected: float) -> None:
    assert rounded(value) == expected
