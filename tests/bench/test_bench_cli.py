"""`shoal bench`: every bench takes --quick and --record, and each result names the command that reproduces it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.cli import build_parser
from services.commands.bench_cmd import ALL_RUNS, BENCHES, NOT_IN_ALL, command_line, other_runs, planned_runs

ROOT = Path(__file__).resolve().parents[2]


def _bench_parser(name: str) -> argparse.ArgumentParser:
    root = build_parser()
    commands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))  # pyright: ignore[reportPrivateUsage]
    bench = commands.choices["bench"]
    names = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))  # pyright: ignore[reportPrivateUsage]
    return names.choices[name]


def test_the_command_line_lists_only_what_differs_from_the_defaults() -> None:
    parser = _bench_parser("prefill")
    args = parser.parse_args(["--ranks", "3", "--quick", "--record", "out", "--json", "--rounds", "7"])
    assert command_line("prefill", parser, args) == "shoal bench prefill --quick --rounds 7 --ranks 3"
    assert command_line("prefill", parser, parser.parse_args([])) == "shoal bench prefill"


def test_every_bench_takes_quick_and_record_and_all_runs_each_bench() -> None:
    for name in BENCHES:
        args = _bench_parser(name).parse_args(["--quick", "--record", "somewhere"])
        assert args.quick and str(args.record) == "somewhere"
    assert {run.bench for run in ALL_RUNS} == set(BENCHES) - set(NOT_IN_ALL)
    assert _bench_parser("all").parse_args(["--quick"]).quick


def test_all_runs_every_record_the_readme_quotes_and_no_other() -> None:
    """The README's table is rendered from bench/results/: `shoal bench all --record bench/results`
    rewrites every one of its files in one go, so no row is left from another commit or machine."""
    recorded = {path.stem for path in (ROOT / "bench" / "results").glob("*.json")}
    assert [run.record for run in ALL_RUNS] == list(dict.fromkeys(run.record for run in ALL_RUNS))  # once each
    assert {run.record for run in ALL_RUNS} == recorded


def test_each_run_parses_its_flags_quick_or_full() -> None:
    for run in ALL_RUNS:
        for quick in (False, True):
            args = _bench_parser(run.bench).parse_args(run.argv(quick))
            assert bool(args.quick) is quick, run.record
    fsync = next(run for run in ALL_RUNS if run.record == "log-fsync")
    assert fsync.argv(quick=True) == ["--fsync", "--quick"]  # the quick sizes, not the record's


def test_only_narrows_the_runs_and_names_an_unknown_record() -> None:
    assert [run.record for run in planned_runs("prefill-3ranks, log")] == ["log", "prefill-3ranks"]
    assert planned_runs(None) == list(ALL_RUNS)
    with pytest.raises(SystemExit, match="unknown record"):
        planned_runs("log,prefil")


def test_records_the_run_did_not_write_are_named(tmp_path: Path) -> None:
    for name in ("log.json", "e2e.json", "serve.json"):
        (tmp_path / name).write_text("{}")
    assert other_runs(tmp_path, [{"bench": "log", "variant": ""}, {"bench": "e2e"}]) == ["serve.json"]
