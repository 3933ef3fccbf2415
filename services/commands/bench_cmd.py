"""`shoal bench <name>`: each benchmark lives in `bench/<name>.py` and prints one JSON object.

A bench module exposes `add_arguments(parser)` and `run(args) -> dict` (the shape of
`bench.result.bench_result`). Every bench also takes `--quick` (brief sizes, for the smoke
test) and `--record DIR` (write the JSON to `DIR/<bench>[-<variant>].json`). Each result
carries `environment` (commit, machine, versions, BLAS: `bench.environment`) and `command`,
the command line that reproduces it. `shoal bench all` runs every record the README quotes, in one go;
`shoal bench render-readme` renders the README's table from the recorded files.
Modules are imported only when their subcommand runs or registers, never mlx at start-up.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

BENCHES: dict[str, str] = {
    "log": "append, replay and offline fold rates of the event log against raw NATS and nats-py",
    "prefill": "overlapped pipeline prefill vs the sequential path vs one process, and the ring's costs",
    "e2e": "time to first token and decode rate through shoal vs bare mlx-lm",
    "cancel": "time from TaskCancelled to every rank idle, in prefill and in decode",
    "replay": "offline fold and diagnose over a generated million-event log",
    "soak": "start-up time and resident memory against 1k..100k finished tasks (snapshot + bounded State)",
    "serve": "many concurrent streams: mlx_lm.server vs shoal up (1 and 2 workers), throughput and latency",
    "netem": "TTFT and decode rate across namespaced hosts, clean links vs a shaped wire (needs root)",
    "prefix": "a conversation's second turn after a long history: TTFT with the prefix cache warm vs cold",
    "batch": "a running batch on 1 and 2 local ranks: a newcomer's prefill vs inter-token p99, cancelling 1 of 16",
    "kv": "a burst of long requests on 1 worker: runner peak memory and wall time, KV unbounded vs kv_cache_bytes",
    "fair": "one client's flood and another's single request: its TTFT, mlx_lm.server vs shoal up (a key each)",
    "models": "two models, requests alternating: TTFT and tok/s, mlx_lm.server vs shoal up; cold load on demand",
    "chaos": "a seeded nemesis against a live workload across namespaced hosts, then the history checked (needs root)",
}


@dataclass(frozen=True, slots=True)
class AllRun:
    """One run of `shoal bench all`: the record it writes (`<bench>[-<variant>]`, checked after
    the run), its bench and its flags; `quick` replaces `args` under `--quick` where the full flags
    would size the run beyond a smoke test."""

    record: str
    bench: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] | None = None

    def argv(self, quick: bool) -> list[str]:
        return [*(self.quick if quick and self.quick is not None else self.args), *(["--quick"] if quick else [])]


# What `shoal bench all` runs: every record the README's table quotes, at one commit on one machine
# in one go (`tests/bench/test_bench_cli.py` holds it to bench/results/). `serve`, hours on a 2-core
# machine with its ~0.44B model, runs last: a run cut short has recorded every other row.
ALL_RUNS: tuple[AllRun, ...] = (
    AllRun("log", "log"),
    AllRun("log-fsync", "log", ("--fsync", "--events", "5000", "--rounds", "3"), quick=("--fsync",)),
    AllRun("log-tls", "log", ("--tls", "--events", "100000", "--rounds", "5"), quick=("--tls",)),
    AllRun("prefill-2ranks", "prefill", ("--ranks", "2")),
    AllRun("prefill-3ranks", "prefill", ("--ranks", "3")),
    AllRun("e2e", "e2e"),
    AllRun("cancel", "cancel"),
    AllRun("replay", "replay"),
    AllRun("soak", "soak"),
    AllRun("prefix", "prefix"),
    AllRun("batch", "batch"),
    AllRun("kv", "kv"),
    AllRun("fair", "fair"),
    AllRun("models", "models"),
    AllRun("serve", "serve"),
)
# Benches `shoal bench all` leaves out, and why.
NOT_IN_ALL: dict[str, str] = {
    "netem": "needs root and network namespaces (and netem in the kernel) to build its hosts",
    "chaos": "minutes of faults against a cluster across namespaced hosts (needs root): run it on its own",
}
SKIPPED_IN_COMMAND = {"json", "record", "handler", "bench", "command", "only"}


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark and print one JSON object")
    names = bench.add_subparsers(dest="bench", metavar="NAME", required=True, parser_class=_BenchParser)
    parsers: dict[str, argparse.ArgumentParser] = {}
    for name, help_text in BENCHES.items():
        parser = names.add_parser(name, help=help_text, bench_module=name)
        _add_common(parser)
        parser.set_defaults(handler=partial(_run_one, name, parser))
        parsers[name] = parser
    every = names.add_parser("all", help="every record the README quotes, one after another, in one go")
    _add_common(every)
    every.add_argument(
        "--only",
        metavar="RECORDS",
        help="only these records (comma-separated, e.g. log,prefill-2ranks): a check, not a table",
    )
    every.set_defaults(handler=partial(_run_all, parsers))
    render = names.add_parser("render-readme", help="render README.md's benchmark table from recorded results")
    render.add_argument("--results", type=Path, default=Path("bench/results"), help="recorded results (JSON files)")
    render.add_argument("--readme", type=Path, default=Path("README.md"))
    render.add_argument("--check", action="store_true", help="only check: exit 1 if the table is out of date")
    render.set_defaults(handler=_render)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the JSON object on one line")
    parser.add_argument("--quick", action="store_true", help="brief sizes: checks the bench runs, not its figures")
    parser.add_argument("--record", type=Path, metavar="DIR", help="also write the JSON to DIR/<bench>.json")


def _load(name: str) -> Any:
    return importlib.import_module(f"bench.{name}")


class _BenchParser(argparse.ArgumentParser):
    """A bench's parser, which imports `bench/<name>.py` for its arguments only once it parses or
    prints help: every other `shoal` command (`shoal up` first) starts without importing the benches
    and what they import (openai, httpx: about a second of every start)."""

    def __init__(self, *args: Any, bench_module: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._bench_module = bench_module

    def parse_known_args(  # pyright: ignore[reportIncompatibleMethodOverride]  # typeshed's three overloads, in one
        self, args: Any = None, namespace: Any = None
    ) -> Any:
        self._add_bench_arguments()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._add_bench_arguments()
        return super().format_help()

    def format_usage(self) -> str:
        self._add_bench_arguments()
        return super().format_usage()

    def _add_bench_arguments(self) -> None:
        if self._bench_module is not None:
            name, self._bench_module = self._bench_module, None
            _load(name).add_arguments(self)


def _measure(name: str, parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    from bench.environment import capture, finish
    from bench.result import write_record

    environment = capture()
    result: dict[str, Any] = _load(name).run(args)
    result["environment"] = finish(environment)
    result["command"] = command_line(name, parser, args)
    if args.record is not None:
        path = write_record(args.record, result)
        print(f"shoal bench {name}: recorded {path}", file=sys.stderr)
    return result


def _run_one(name: str, parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    result = _measure(name, parser, args)
    _print(result, one_line=args.json)
    # A bench whose checks are its verdict (chaos: no violation) fails its command when one is false.
    failed = getattr(_load(name), "FAIL_ON_CHECKS", False) and not all(result["checks"].values())
    return 1 if failed else 0


def _run_all(parsers: dict[str, argparse.ArgumentParser], args: argparse.Namespace) -> int:
    from bench.result import record_name

    runs = planned_runs(args.only)
    results: list[dict[str, Any]] = []
    for run in runs:
        argv = run.argv(bool(args.quick))
        if args.record is not None:
            argv += ["--record", str(args.record)]
        print(f"shoal bench all: {run.bench} {shlex.join(argv)}", file=sys.stderr)
        result = _measure(run.bench, parsers[run.bench], parsers[run.bench].parse_args(argv))
        written = record_name(result).removesuffix(".json")
        if written != run.record:
            raise SystemExit(f"shoal bench all: {run.bench} {shlex.join(argv)} wrote {written!r}, not {run.record!r}")
        results.append(result)
    stale = [] if args.record is None else other_runs(args.record, results)
    for name in stale:
        print(f"shoal bench all: {args.record}/{name} is from another run (another commit or start)", file=sys.stderr)
    trees = sorted({f"{r['environment']['commit']}{'+dirty' if r['environment']['dirty'] else ''}" for r in results})
    if len(trees) > 1:  # the tree moved during the run: the table would not be one commit's
        print(f"shoal bench all: the runs saw {len(trees)} trees: {', '.join(trees)}", file=sys.stderr)
    summary = {"bench": "all", "results": results, "records_from_other_runs": stale, "trees": trees}
    _print(summary, one_line=args.json)
    return 0 if len(trees) == 1 else 1


def planned_runs(only: str | None) -> list[AllRun]:
    """The runs of `shoal bench all`, or those `--only` names (records, comma-separated)."""
    if not only:
        return list(ALL_RUNS)
    named = [name.strip() for name in only.split(",") if name.strip()]
    known = {run.record for run in ALL_RUNS}
    if unknown := [name for name in named if name not in known]:
        raise SystemExit(f"shoal bench all --only: unknown record(s) {unknown}; known: {', '.join(sorted(known))}")
    return [run for run in ALL_RUNS if run.record in named]


def other_runs(directory: Path, results: list[dict[str, Any]]) -> list[str]:
    """The records in `directory` this run did not write: another commit's or another start's rows,
    which a table recorded in one go must not hold."""
    from bench.result import record_name

    written = {record_name(result) for result in results}
    return sorted(path.name for path in directory.glob("*.json") if path.name not in written)


def _print(result: dict[str, Any], one_line: bool) -> None:
    print(json.dumps(result, indent=None if one_line else 2))


def command_line(name: str, parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The `shoal bench` command that reproduces `args`: every option not at its default."""
    words = ["shoal", "bench", name]
    for action in parser._actions:  # pyright: ignore[reportPrivateUsage]  # argparse has no public list
        if not action.option_strings or action.dest in SKIPPED_IN_COMMAND:
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        words += [flag] if isinstance(value, bool) else [flag, str(value)]
    return shlex.join(words)


def _render(args: argparse.Namespace) -> int:
    from bench.readme_table import render_readme
    from bench.result import load_records

    readme: Path = args.readme
    current = readme.read_text()
    rendered = render_readme(current, load_records(args.results))
    if rendered == current:
        print(f"{readme}: the benchmark table matches {args.results}", file=sys.stderr)
        return 0
    if args.check:
        print(f"{readme}: the benchmark table is out of date; run `shoal bench render-readme`", file=sys.stderr)
        return 1
    readme.write_text(rendered)
    print(f"{readme}: benchmark table rendered from {args.results}", file=sys.stderr)
    return 0
