"""`shoal config show`: every effective setting, its value and where it came from."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from services.config import ConfigError, add_common_flags, config_from_args


def register(subparsers: Any) -> None:
    config = subparsers.add_parser("config", help="show the effective configuration")
    actions = config.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="effective values with their sources (default < shoal.yaml < env < cli)")
    add_common_flags(show)
    show.add_argument("--json", action="store_true", help="print {key: {value, source}} as JSON")
    show.set_defaults(handler=show_command)


def show_command(args: argparse.Namespace) -> int:
    try:
        resolved = config_from_args(args)
    except ConfigError as exc:
        print(f"shoal config: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(resolved.to_dict(), indent=2))
        return 0
    if resolved.yaml_path:
        print(f"# config file: {resolved.yaml_path}")
    width = max(len(key) for key, _, _ in resolved.items())
    for key, value, source in resolved.items():
        shown = "none" if value is None else value
        print(f"{key:<{width}}  {shown!s:<28}  {source}")
    return 0
