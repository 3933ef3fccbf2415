"""Table tests of the pipelined decode schedule (pure, no MLX): who computes what when, where the
ranks agree, and that every send has its receiver in the next iteration."""

from __future__ import annotations

import itertools

import pytest

from runner.engine.decode_schedule import DecodeSchedule, next_iteration

pytestmark = pytest.mark.timeout(10)
SHAPES = [(world, micro) for world in (1, 2, 3, 4) for micro in (1, 2, 3, 4, 5)]
HORIZON = 40


def grid(schedule: DecodeSchedule, iterations: int) -> list[list[int | None]]:
    return [[schedule.work(rank, t) for t in range(iterations)] for rank in range(schedule.world)]


@pytest.mark.parametrize(
    ("world", "micro", "expected"),
    [
        (1, 1, [[0, 0, 0, 0]]),
        (2, 1, [[0, None, 0, None], [None, 0, None, 0]]),  # one micro-batch: lockstep, one rank idle
        (2, 2, [[0, 1, 0, 1], [None, 0, 1, 0]]),  # both ranks busy from iteration 1 on
        (3, 2, [[0, 1, None, 0], [None, 0, 1, None], [None, None, 0, 1]]),
        (3, 3, [[0, 1, 2, 0], [None, 0, 1, 2], [None, None, 0, 1]]),
        (2, 3, [[0, 1, 2, 0], [None, 0, 1, 2]]),  # more micro-batches than ranks: period 3
    ],
)
def test_the_schedule_table(world: int, micro: int, expected: list[list[int | None]]) -> None:
    assert grid(DecodeSchedule(world, micro), 4) == expected


@pytest.mark.parametrize(("world", "micro"), SHAPES)
def test_each_micro_batch_moves_one_rank_per_iteration(world: int, micro: int) -> None:
    schedule = DecodeSchedule(world, micro)
    for rank in range(1, world):
        assert all(schedule.work(rank, t) is None for t in range(rank))  # filling
        for t in range(rank, HORIZON):
            assert schedule.work(rank, t) == schedule.work(rank - 1, t - 1)


@pytest.mark.parametrize(("world", "micro"), SHAPES)
def test_every_send_is_received_next_iteration(world: int, micro: int) -> None:
    schedule = DecodeSchedule(world, micro)
    for t in range(HORIZON):
        for rank in range(world):
            if schedule.sends(rank, t):
                assert schedule.receives(rank + 1, t + 1)
                assert schedule.work(rank + 1, t + 1) == schedule.work(rank, t)
            if schedule.receives(rank, t):
                assert schedule.sends(rank - 1, t - 1)


@pytest.mark.parametrize(("world", "micro"), SHAPES)
def test_a_boundary_leaves_no_activation_of_its_micro_batch_anywhere(world: int, micro: int) -> None:
    """At the agreement of micro-batch m's boundary no rank has computed m since its last entry at
    rank 0 without it reaching the last rank, and rank 0 takes m again only later: a membership
    change there is seen by every rank before m's next forward."""
    schedule = DecodeSchedule(world, micro)
    for t in range(HORIZON):
        m = schedule.boundary(t)
        if m is None:
            continue
        entry = schedule.next_entry(m, t)
        assert entry > t
        assert schedule.work(0, entry) == m
        for between in range(t + 1, entry):
            assert all(schedule.work(rank, between) != m for rank in range(world))


@pytest.mark.parametrize(("world", "micro"), SHAPES)
def test_every_micro_batch_gets_a_token_once_per_period(world: int, micro: int) -> None:
    schedule = DecodeSchedule(world, micro)
    boundaries = [schedule.boundary(t) for t in range(HORIZON)]
    first_full = world - 1
    for m in range(micro):
        hits = [t for t, b in enumerate(boundaries) if b == m]
        assert hits[0] == first_full + m
        assert all(b - a == schedule.period for a, b in itertools.pairwise(hits))


@pytest.mark.parametrize(("world", "micro"), [(w, w) for w in (2, 3, 4)])
def test_with_as_many_micro_batches_as_ranks_no_rank_idles_once_full(world: int, micro: int) -> None:
    schedule = DecodeSchedule(world, micro)
    for t in range(world - 1, HORIZON):
        assert all(schedule.work(rank, t) is not None for rank in range(world))


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        DecodeSchedule(0, 1)
    with pytest.raises(ValueError, match="outside world"):
        DecodeSchedule(2, 2).work(2, 0)


@pytest.mark.parametrize(
    ("iteration", "occupied", "just_agreed", "expected"),
    [
        (None, [False, False], 0, None),  # empty: lockstep
        (None, [True, False], 0, None),  # one micro-batch: lockstep, one all-reduce per token
        (None, [True, True], 0, 0),  # a second one joined: the ring starts filling
        (None, [False, True, False], 0, 0),
        (0, [True, True], None, 1),  # filling: no boundary yet
        (5, [True, True], 1, 6),
        (5, [True, False], 1, 6),  # micro-batch 0 is mid-ring: keep turning until it is agreed
        (6, [True, False], 0, None),  # ...then lockstep
        (6, [False, False], 0, None),  # everything left at its boundary
        (7, [False, True, False], 1, None),  # the one left moves to index 0 (the caller's part)
    ],
)
def test_next_iteration(
    iteration: int | None, occupied: list[bool], just_agreed: int | None, expected: int | None
) -> None:
    assert next_iteration(iteration, occupied, just_agreed) == expected
