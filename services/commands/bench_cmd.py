"""`shoal bench <name>`: each benchmark lives in `bench/<name>.py` and prints one JSON object.

A bench module exposes `add_arguments(parser)` and `run(args) -> dict`. Modules are imported
only when their subcommand runs, so a bench that needs MLX does not load it for the others.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any

BENCHES: dict[str, str] = {
    "log": "append, replay and offline fold rates of the event log against a raw NATS publish",
    "prefill": "overlapped pipeline prefill vs the sequential path vs one rank",
    "e2e": "time to first token and decode rate through shoal vs bare mlx-lm",
    "cancel": "time from TaskCancelled to every rank idle",
    "replay": "offline fold and diagnose over a generated million-event log",
}


def register(subparsers: Any) -> None:
    bench = subparsers.add_parser("bench", help="run a benchmark and print one JSON object")
    names = bench.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name, help_text in BENCHES.items():
        parser = names.add_parser(name, help=help_text)
        parser.add_argument("--json", action="store_true", help="print only the JSON object (the default output)")
        parser.set_defaults(handler=_runner_for(name), bench_parser=parser)
        module = _load(name)
        if module is not None:
            module.add_arguments(parser)


def _load(name: str) -> Any:
    try:
        return importlib.import_module(f"bench.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"bench.{name}":
            return None  # not written yet: the subcommand says so when run
        raise


def _runner_for(name: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        module = _load(name)
        if module is None:
            print(f"shoal bench {name}: this benchmark is not available in this build", file=sys.stderr)
            return 2
        result = module.run(args)
        print(json.dumps(result, indent=None if args.json else 2, sort_keys=False))
        return 0

    return run
