"""Table and property tests of the pipelined prefill chunks' schedule (pure, no MLX): which rank
computes which chunk group when, that every send has its receiver at the next step in the order
sent, and when a group has passed every rank."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.engine.chunk_ring import ChunkRing

pytestmark = pytest.mark.timeout(30)


def run(world: int, takes: dict[int, str], steps: int) -> tuple[list[list[str | None]], list[bool]]:
    """Per rank, the group computed at each step; and whether the ring is busy after each step."""
    ring: ChunkRing[str] = ChunkRing(world)
    grid: list[list[str | None]] = [[] for _ in range(world)]
    busy = []
    for step in range(steps):
        if step in takes:
            ring.take(step, takes[step])
        for rank in range(world):
            grid[rank].append(ring.work(rank, step))
        ring.retire(step)
        busy.append(ring.busy())
    return grid, busy


@pytest.mark.parametrize(
    ("world", "takes", "expected", "busy"),
    [
        (1, {0: "a", 1: "b"}, [["a", "b", None]], [False, False, False]),  # one rank: done in its step
        (2, {0: "a", 1: "b"}, [["a", "b", None], [None, "a", "b"]], [True, True, False]),
        (2, {0: "a", 2: "b"}, [["a", None, "b", None], [None, "a", None, "b"]], [True, False, True, False]),
        (
            3,
            {0: "a", 1: "b", 2: "c"},
            [["a", "b", "c", None, None], [None, "a", "b", "c", None], [None, None, "a", "b", "c"]],
            [True, True, True, True, False],
        ),
    ],
)
def test_the_schedule_table(
    world: int, takes: dict[int, str], expected: list[list[str | None]], busy: list[bool]
) -> None:
    grid, after = run(world, takes, len(expected[0]))
    assert grid == expected
    assert after == busy


@settings(max_examples=200, deadline=None)
@given(world=st.integers(1, 4), taken=st.lists(st.booleans(), max_size=20))
def test_every_group_passes_every_rank_once_one_step_apart(world: int, taken: list[bool]) -> None:
    takes = {step: f"g{step}" for step, yes in enumerate(taken) if yes}
    steps = len(taken) + world
    grid, busy = run(world, takes, steps)
    ring: ChunkRing[str] = ChunkRing(world)
    for step, group in takes.items():
        seen = [(rank, t) for rank in range(world) for t in range(steps) if grid[rank][t] == group]
        assert seen == [(rank, step + rank) for rank in range(world)]  # rank r+1 one step after rank r
        assert all(busy[t] for t in range(step, ring.lands_at(step)))  # in flight until it lands
    # what rank r sends after step t (its group), rank r+1 receives at step t+1: same groups, same order
    for rank in range(world - 1):
        sent = [g for g in grid[rank][:-1] if g is not None]
        received = [g for g in grid[rank + 1][1:] if g is not None]
        assert sent == received
    assert not busy[-1]  # drained once the last group reached the last rank


def test_steps_only_move_forward() -> None:
    ring: ChunkRing[str] = ChunkRing(2)
    ring.take(3, "a")
    with pytest.raises(ValueError, match="after one taken at step 3"):
        ring.take(3, "b")
    with pytest.raises(ValueError, match="outside world"):
        ring.work(2, 3)
    with pytest.raises(ValueError, match="at least one rank"):
        ChunkRing(0)


@pytest.mark.parametrize(("world", "taken_at", "lands"), [(1, 5, 5), (2, 5, 6), (3, 0, 2), (4, 7, 10)])
def test_a_group_lands_when_the_last_rank_computed_it(world: int, taken_at: int, lands: int) -> None:
    assert ChunkRing(world).lands_at(taken_at) == lands
