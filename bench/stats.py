"""The statistics every bench reports, in one pure module so they are tested once.

Why these and not best-of-N: on a shared machine the best run is the one the neighbours
happened to leave alone, and picking it per measure pairs a numerator and a denominator from
different runs. Instead every bench measures its sides in alternating rounds (`bench.rounds`)
and reports, per measure:
- the median, with its spread: p10/p90 when there are at least `SMALL_N` samples, min/max
  below that (a p10 of five samples is just the minimum under another name), and n;
- for a pair of sides measured in the same rounds, the median of the per-round ratios (or
  differences): drift that hits both sides of a round cancels out;
- every target as `{"target": ">= 0.95", "value": <a median>, "met": <bool>}`, so a figure is
  judged by the JSON, never by hand.

Percentiles are nearest-rank (always an observed value). `tail` says whether a high percentile
is simply the maximum, which it is whenever n < 1 / (1 - q): a p99 of 50 samples is the max,
a p99 of 100 samples is the second largest.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

SMALL_N = 10
SIGNIFICANT = 4
UNEXPLAINED = "missed; the bench has no account yet of what bounds it"

Comparison = Literal["ratio", "difference"]
Bound = Literal[">=", "<=", "=="]

_OPERATORS: dict[Bound, Callable[[float, float], bool]] = {">=": operator.ge, "<=": operator.le, "==": operator.eq}


def rounded(value: float, digits: int = SIGNIFICANT) -> float:
    """`value` to `digits` significant digits, but never coarser than a whole number: JSON a person can read."""
    if value == 0 or not math.isfinite(value):
        return value
    places = digits - 1 - math.floor(math.log10(abs(value)))
    return float(round(value, max(0, places)))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, `q` in [0, 1]: the smallest sample with at least q of them at or below it."""
    if not values:
        raise ValueError("percentile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def summarize(values: Sequence[float], unit: str) -> dict[str, Any]:
    """Median, spread, n, the unit and the samples themselves (in measured order)."""
    if not values:
        return {"median": None, "n": 0, "unit": unit, "samples": []}
    out: dict[str, Any] = {"median": rounded(statistics.median(values))}
    if len(values) >= SMALL_N:
        out |= {"p10": rounded(percentile(values, 0.10)), "p90": rounded(percentile(values, 0.90))}
    else:
        out |= {"min": rounded(min(values)), "max": rounded(max(values))}
    return out | {"n": len(values), "unit": unit, "samples": [rounded(v) for v in values]}


class Paired(NamedTuple):
    """Per-round ratios (or differences) of two sides, and how many rounds had no ratio: a round
    whose denominator is zero (a side that produced nothing) is counted, never silently dropped."""

    values: list[float]
    zero_denominators: int


def per_round(numerators: Sequence[float], denominators: Sequence[float], kind: Comparison) -> Paired:
    """a_i / b_i (or a_i - b_i) for each round i; both sides must have been measured every round."""
    if len(numerators) != len(denominators):
        raise ValueError(f"unpaired rounds: {len(numerators)} against {len(denominators)}")
    pairs = list(zip(numerators, denominators, strict=True))
    if kind == "ratio":
        values = [a / b for a, b in pairs if b != 0]
        return Paired(values, len(pairs) - len(values))
    return Paired([a - b for a, b in pairs], 0)


def compare(
    numerators: Sequence[float], denominators: Sequence[float], kind: Comparison, of: str, unit: str = ""
) -> dict[str, Any]:
    """Summary of the per-round ratios (or differences) of two sides; `of` names them, e.g. "a / b".
    `rounds` is how many rounds were paired and `zero_denominators` how many of them had no ratio."""
    paired = per_round(numerators, denominators, kind)
    summary = summarize(paired.values, unit or ("x" if kind == "ratio" else ""))
    return {**summary, "of": of, "rounds": len(numerators), "zero_denominators": paired.zero_denominators}


def target(value: float | None, bound: Bound, limit: float, unit: str = "", bounded_by: str = "") -> dict[str, Any]:
    """A target judged on `value` (a median): stated, valued and met, side by side. A missed one
    carries `note`: what bounds it (`bounded_by`, the bench's account, from its own figures where
    it has them), or, where the bench has none, that it has none."""
    met = value is not None and math.isfinite(value) and _OPERATORS[bound](value, limit)
    stated = f"{bound} {limit:g}{' ' + unit if unit else ''}"
    judged: dict[str, Any] = {"target": stated, "value": value, "met": met}
    if not met:
        judged["note"] = bounded_by or UNEXPLAINED
    return judged


def tail(values: Sequence[float], q: float) -> dict[str, Any]:
    """A high percentile and whether it is only the maximum (too few samples to say more)."""
    needed = samples_for_a_real_tail(q)
    if not values:
        return {"value": None, "is_max": True, "n": 0, "n_for_a_real_tail": needed}
    return {
        "value": rounded(percentile(values, q)),
        "is_max": len(values) < needed,
        "n": len(values),
        "n_for_a_real_tail": needed,
    }


def samples_for_a_real_tail(q: float) -> int:
    """The fewest samples whose nearest-rank `q` percentile is not the maximum."""
    if not 0.0 <= q < 1.0:
        raise ValueError(f"q must be in [0, 1), got {q}")
    n = 1
    while math.ceil(q * n) >= n:
        n += 1
    return n
