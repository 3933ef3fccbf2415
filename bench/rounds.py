"""Measuring sides in alternating rounds, so drift on a shared machine hits every side alike.

A bench compares sides (shoal vs bare mlx-lm, pipeline vs sequential, ...). Measured one
after another, a neighbour's build in the middle lands on one side only and goes straight into
the ratio. Measured in rounds, each round runs every side once, and the order rotates from
round to round (A B, B A, A B, ...) so no side is always the one that runs right after a pause.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """The order of the sides in round `round_index`: the list rotated by one per round."""
    if not names:
        return []
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def run_rounds(sides: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Each side's samples, one per round, in round order (so sample i of two sides are paired)."""
    samples: dict[str, list[T]] = {name: [] for name in sides}
    for index in range(rounds):
        for name in rotated(list(sides), index):
            samples[name].append(sides[name]())
    return samples
