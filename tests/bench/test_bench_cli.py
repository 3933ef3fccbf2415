"""`shoal bench`: every bench takes --quick and --record, and each result names the command that reproduces it."""

from __future__ import annotations

import argparse

from services.cli import build_parser
from services.commands.bench_cmd import ALL_RUNS, BENCHES, NOT_IN_ALL, command_line


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
    assert {name for name, _ in ALL_RUNS} == set(BENCHES) - set(NOT_IN_ALL)
    assert _bench_parser("all").parse_args(["--quick"]).quick
