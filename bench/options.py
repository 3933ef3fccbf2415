"""A bench's sized options: one default for the real run, one for `--quick`, explicit flags win.

`shoal bench all --quick` (and the suite's smoke test) runs every bench briefly; the sizes that
make a bench brief are declared beside the full ones, in one place per bench, so neither can
drift from its help text.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sized:
    flag: str  # "--rounds"
    full: Any
    quick: Any
    help: str
    type: Callable[[str], Any] = int

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


def add_sized(parser: argparse.ArgumentParser, options: Sequence[Sized]) -> None:
    for option in options:
        parser.add_argument(
            option.flag,
            type=option.type,
            default=None,
            help=f"{option.help} (default {option.full}; {option.quick} with --quick)",
        )


def resolve(args: argparse.Namespace, options: Sequence[Sized]) -> dict[str, Any]:
    """dest -> value: the flag if given, else the quick or the full default."""
    quick = bool(getattr(args, "quick", False))
    resolved: dict[str, Any] = {}
    for option in options:
        given = getattr(args, option.dest, None)
        resolved[option.dest] = given if given is not None else (option.quick if quick else option.full)
    return resolved
