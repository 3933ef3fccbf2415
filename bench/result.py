"""The one shape every bench returns, so the README renderer and the smoke test read them alike.

- `measures`: name -> `stats.summarize(...)` (median, spread, n, unit, samples);
- `comparisons`: name -> `stats.compare(...)` (per-round ratios or differences of two sides);
- `targets`: name -> `stats.target(...)` (stated, valued from a median, `met`);
- `about`: one sentence on what the bench measures, for the README's table;
- `headline`: the measures and comparisons the README's table shows, in order;
- `notes`: sentences for the README that quote only figures of this result;
- `checks`: named booleans that the run measured what it claims (states equal, counts add up).
Anything else a bench reports goes in `details`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.stats import rounded

KEYS = (
    "bench",
    "variant",
    "about",
    "quick",
    "settings",
    "measures",
    "comparisons",
    "targets",
    "headline",
    "notes",
    "checks",
    "details",
)


def bench_result(
    bench: str,
    *,
    about: str,
    quick: bool,
    settings: Mapping[str, Any],
    measures: Mapping[str, Any],
    comparisons: Mapping[str, Any],
    targets: Mapping[str, Any],
    headline: Sequence[str],
    notes: Sequence[str] = (),
    checks: Mapping[str, bool] | None = None,
    variant: str = "",
    details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    unknown = [name for name in headline if name not in measures and name not in comparisons]
    if unknown:
        raise ValueError(f"headline names no measure or comparison: {unknown}")
    return {
        "bench": bench,
        "variant": variant,
        "about": about,
        "quick": quick,
        "settings": dict(settings),
        "measures": dict(measures),
        "comparisons": dict(comparisons),
        "targets": dict(targets),
        "headline": list(headline),
        "notes": list(notes),
        "checks": dict(checks or {}),
        "details": dict(details or {}),
    }


def record_name(result: Mapping[str, Any]) -> str:
    """The file a recorded result goes to: `<bench>.json`, or `<bench>-<variant>.json`."""
    variant = result.get("variant") or ""
    return f"{result['bench']}-{variant}.json" if variant else f"{result['bench']}.json"


def write_record(directory: Path, result: Mapping[str, Any]) -> Path:
    """Write `result` as `directory/<record_name>` (pretty, key order kept); returns the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / record_name(result)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def load_records(directory: Path) -> list[dict[str, Any]]:
    """Every recorded result in `directory`, by file name."""
    return [json.loads(path.read_text()) for path in sorted(directory.glob("*.json"))]


def median_text(measures: dict[str, Any], comparisons: dict[str, Any], name: str) -> str:
    """The median of measure or comparison `name`, readable ("none" when it has none)."""
    value = (measures.get(name) or comparisons[name])["median"]
    return "none" if value is None else readable(value)


def readable(value: float) -> str:
    """A figure for people: thousands separators from 100 up, three significant digits below."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{rounded(value, 3):g}"
