"""README.md's benchmark section is exactly what `shoal bench render-readme` makes of bench/results/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.readme_table import END, START, MissingMarkers, render_readme, render_section
from bench.result import bench_result, load_records, readable, record_name, write_record
from bench.stats import compare, summarize, target

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_table_matches_the_recorded_results() -> None:
    readme = (ROOT / "README.md").read_text()
    assert render_readme(readme, load_records(ROOT / "bench" / "results")) == readme, (
        "README.md's benchmark table differs from bench/results/: run `uv run shoal bench render-readme`"
    )


def _result(quick: bool = False, variant: str = "") -> dict[str, Any]:
    result = bench_result(
        "prefill",
        about="what it measures",
        variant=variant,
        quick=quick,
        settings={"rounds": 3},
        measures={"rate_tps": summarize([510.0, 495.5, 1520.25], "tok/s")},
        comparisons={"speedup": compare([3.0, 2.0], [2.0, 2.0], "ratio", "a / b")},
        targets={
            "efficiency": target(0.79, ">=", 0.95, bounded_by="two ranks share two cores"),
            "speedup": target(1.25, ">=", 1.0),
        },
        headline=["rate_tps", "speedup"],
        notes=["a sentence from the figures"],
    )
    environment = {
        "commit": "0123456789abcdef",
        "dirty": True,
        "cpu_count": 2,
        "cpu_model": "EPYC",
        "load_avg_before": [0.5, 0.4, 0.3],
        "recorded_at": "2026-11-30T00:00:00+00:00",
    }
    return result | {"environment": environment, "command": "shoal bench prefill --ranks 3"}


def test_a_row_shows_the_command_figures_spread_targets_and_provenance() -> None:
    section = render_section([_result(variant="3ranks")])
    row = next(line for line in section.splitlines() if line.startswith("| `uv run shoal bench prefill"))
    assert "| `uv run shoal bench prefill --ranks 3` | what it measures |" in row
    assert "`rate_tps` 510 tok/s [496..1,520, n=3]" in row
    assert "`speedup` 1.25 x [1..1.5, n=2]" in row
    assert "`efficiency` >= 0.95: **not met** (0.79): two ranks share two cores<br>`speedup` >= 1: met (1.25)" in row
    assert row.endswith("| 0123456+dirty, 2x EPYC, load 0.5, 2026-11-30T00:00:00+00:00 |")
    assert "- prefill (3ranks): a sentence from the figures" in section


def test_rounds_with_a_zero_denominator_are_shown_and_records_before_the_count_render_as_they_did() -> None:
    result = _result()
    result["comparisons"]["speedup"] = compare([3.0, 2.0, 1.0], [2.0, 0.0, 0.0], "ratio", "a / b")
    row = next(line for line in render_section([result]).splitlines() if line.startswith("| `uv run"))
    assert "`speedup` 1.5 x [1.5..1.5, n=1, 2 of 3 rounds with a zero denominator]" in row
    old = _result()
    for key in ("rounds", "zero_denominators"):
        del old["comparisons"]["speedup"][key]
    del old["targets"]["efficiency"]["note"]
    row = next(line for line in render_section([old]).splitlines() if line.startswith("| `uv run"))
    assert "`speedup` 1.25 x [1..1.5, n=2]" in row and "**not met** (0.79)<br>" in row


def test_a_quick_run_is_marked_as_a_placeholder_and_no_runs_say_so() -> None:
    assert "quick run: a placeholder to replace" in render_section([_result(quick=True)])
    assert "(no recorded runs yet)" in render_section([])


def test_rendering_replaces_only_the_marked_section_and_needs_the_markers() -> None:
    readme = f"# title\n\n{START}\nold table\n{END}\n\n## next\n"
    rendered = render_readme(readme, [_result()])
    assert rendered.startswith(f"# title\n\n{START}\n") and rendered.endswith(f"{END}\n\n## next\n")
    assert "old table" not in rendered and render_readme(rendered, [_result()]) == rendered
    with pytest.raises(MissingMarkers):
        render_readme("# no markers\n", [])


def test_records_are_written_by_bench_and_variant_and_read_back(tmp_path: Path) -> None:
    assert record_name(_result()) == "prefill.json" and record_name(_result(variant="3ranks")) == "prefill-3ranks.json"
    write_record(tmp_path, _result(variant="2ranks"))
    write_record(tmp_path, _result(variant="3ranks"))
    assert [r["variant"] for r in load_records(tmp_path)] == ["2ranks", "3ranks"]


def test_a_headline_must_name_a_figure_of_the_result() -> None:
    with pytest.raises(ValueError, match="headline"):
        bench_result("x", about="", quick=True, settings={}, measures={}, comparisons={}, targets={}, headline=["nope"])


@pytest.mark.parametrize(("value", "shown"), [(153218.4, "153,218"), (100, "100"), (0.97094, "0.971"), (-3.5, "-3.5")])
def test_readable_figures(value: float, shown: str) -> None:
    assert readable(value) == shown
