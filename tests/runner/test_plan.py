"""Table tests of the pure prefill planning (no MLX)."""

from __future__ import annotations

import pytest

from runner.engine.plan import (
    choose_path,
    chunk_sizes,
    effective_step,
    even_split,
    rank_schedule,
    split_from_counts,
    validate_split,
)
from runner.errors import SplitError
from tests.runner.harness import expected_callbacks

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("step", "world", "expected"),
    [(4096, 1, 4096), (4096, 2, 2048), (4096, 3, 1365), (4096, 4, 1024), (4096, 8, 1024), (2, 4, 1)],
)
def test_effective_step(step: int, world: int, expected: int) -> None:
    assert effective_step(step, world) == expected


@pytest.mark.parametrize(
    ("length", "step", "expected"),
    [(1, 4, []), (2, 4, [1]), (4, 4, [3]), (5, 4, [4]), (6, 4, [4, 1]), (9, 4, [4, 4]), (10, 4, [4, 4, 1])],
)
def test_chunk_sizes_reserve_the_last_token(length: int, step: int, expected: list[int]) -> None:
    assert chunk_sizes(length, step) == expected


@pytest.mark.parametrize(
    ("length", "step", "world", "expected"),
    [
        (23, 4096, 3, "sequential"),  # the seed's wedge: one chunk of 1365
        (5000, 4096, 3, "pipeline"),
        (1, 12, 2, "sequential"),
        (7, 12, 2, "sequential"),  # 6 tokens after reserving the last: one chunk of 6
        (8, 12, 2, "pipeline"),  # 7 tokens: chunks 6 + 1
        (100, 12, 1, "sequential"),  # one rank never overlaps
    ],
)
def test_gate(length: int, step: int, world: int, expected: str) -> None:
    assert choose_path(length, step, world) == expected


def test_forced_path_wins_over_the_gate() -> None:
    assert choose_path(2, 4096, 3, "pipeline") == "pipeline"
    assert choose_path(9000, 4096, 3, "sequential") == "sequential"


@pytest.mark.parametrize(
    ("rank", "world", "chunks", "path", "expected"),
    [
        (0, 2, 3, "pipeline", [0, 1, 2, None]),
        (1, 2, 3, "pipeline", [None, 0, 1, 2]),
        (1, 3, 1, "pipeline", [None, 0, None]),
        (2, 3, 0, "pipeline", [None, None]),
        (0, 1, 2, "pipeline", [0, 1]),
        (2, 3, 3, "sequential", [0, 1, 2]),
    ],
)
def test_rank_schedule(rank: int, world: int, chunks: int, path: str, expected: list[int | None]) -> None:
    assert rank_schedule(rank, world, chunks, path) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("chunks", [0, 1, 2, 5])
def test_chunk_k_reaches_rank_r_one_iteration_after_rank_r_minus_1(world: int, chunks: int) -> None:
    schedules = [rank_schedule(r, world, chunks, "pipeline") for r in range(world)]
    assert len({len(s) for s in schedules}) == 1  # same number of agreement collectives everywhere
    for rank in range(1, world):
        for iteration, chunk in enumerate(schedules[rank]):
            if chunk is not None:
                assert schedules[rank - 1][iteration - 1] == chunk


@pytest.mark.parametrize(
    ("length", "step", "expected"),
    [
        (1, 4, [(0, 1), (1, 1)]),
        (2, 4, [(0, 2), (1, 2), (2, 2)]),
        (10, 4, [(0, 10), (4, 10), (8, 10), (9, 10), (10, 10)]),
    ],
)
def test_expected_callbacks_follow_generate_step(length: int, step: int, expected: list) -> None:
    assert expected_callbacks(length, step) == expected


def test_even_split_spreads_the_remainder_first() -> None:
    assert even_split(8, 3) == [(0, 3), (3, 6), (6, 8)]
    assert even_split(8, 1) == [(0, 8)]


@pytest.mark.parametrize(
    ("ranges", "n_layers", "message"),
    [
        ([], 8, "empty layer split"),
        ([(0, 4), (5, 8)], 8, "not contiguous"),
        ([(0, 4), (4, 4), (4, 8)], 8, "empty layer range"),
        ([(0, 4), (4, 6)], 8, "covers 6 layers"),
        ([(1, 8)], 8, "not contiguous"),
        ([(0, 1)] * 9, 8, "only 8 layers"),
    ],
)
def test_validate_split_errors(ranges: list, n_layers: int, message: str) -> None:
    with pytest.raises(SplitError, match=message):
        validate_split(ranges, n_layers)


def test_split_from_counts_and_too_many_ranks() -> None:
    assert split_from_counts([1, 7], 8) == [(0, 1), (1, 8)]
    with pytest.raises(SplitError, match="covers 7"):
        split_from_counts([4, 3], 8)
    with pytest.raises(SplitError, match="only 8 layers"):
        even_split(8, 9)
