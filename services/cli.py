"""The `shoal` console script: one argparse tree, each subcommand registered by its own module.

A command module exposes `register(subparsers) -> None`, which adds its parser and sets
`handler=<callable(args) -> int>` as the parser default. Modules are imported here, but a
command that needs MLX imports `runner` lazily inside its handler (mlx stays under runner/).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each entry is a module under services/commands exposing `register(subparsers)`.
COMMAND_MODULES: tuple[str, ...] = (
    "bench_cmd",
    "cluster_cmds",
    "model_cmd",
    "generate_cmd",
    "nats_cmd",
    "events_cmd",
    "config_cmd",
    "replay_cmd",
    "diagnose_cmd",
    "models_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal",
        description="Pipeline-parallel LLM inference on MLX, orchestrated through a NATS JetStream event log.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"services.commands.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
