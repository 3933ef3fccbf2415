"""The micro-batch ring's bookkeeping (rows only, no forward): where a prefilled stream joins, when
the batch switches between lockstep and the ring, and that the last busy micro-batch becomes the
first again."""

from __future__ import annotations

import pytest

from runner.engine.micro_batches import MicroBatches

pytestmark = pytest.mark.timeout(10)


def test_one_rank_is_always_lockstep_on_one_micro_batch() -> None:
    micro = MicroBatches(1)
    micro.parts[0].rows = ("a", "b")
    assert micro.join_target() is micro.parts[0]
    assert micro.join_room(5) == 5  # one micro-batch: every prefilled stream joins at once
    micro.advance()
    assert micro.lockstep and micro.working(0) is micro.parts[0]


def test_a_second_stream_starts_the_ring_and_the_last_one_left_ends_it() -> None:
    micro = MicroBatches(2)
    assert micro.join_target() is micro.parts[0]  # empty batch: the first micro-batch
    micro.parts[0].rows = ("a",)
    micro.advance()
    assert micro.lockstep and micro.working(1) is micro.parts[0]  # one all-reduce per token
    assert micro.join_target() is micro.parts[1] and micro.join_room(3) == 2  # its share of 4 rows starts the ring
    micro.parts[1].rows = ("b",)
    micro.advance()
    assert micro.iteration == 0  # filling: rank 0 takes "a", rank 1 waits
    assert micro.working(0) is micro.parts[0] and micro.working(1) is None
    assert micro.boundary() is None and micro.join_target() is None and micro.join_room(2) == 0
    micro.advance()
    assert micro.working(0) is micro.parts[1] and micro.working(1) is micro.parts[0]
    assert micro.boundary() is micro.parts[0]
    micro.parts[0].rows = ()  # "a" leaves at its boundary; "b" is on rank 1 next step
    micro.advance()
    assert not micro.lockstep and micro.boundary() is micro.parts[1]
    b_part = micro.parts[1]
    micro.advance()  # "b" agreed and alone: lockstep, and it becomes the first micro-batch
    assert micro.lockstep and micro.parts[0] is b_part


def test_joins_keep_the_ring_balanced() -> None:
    micro = MicroBatches(2)
    micro.parts[0].rows, micro.parts[1].rows = ("a", "c", "d"), ("b",)
    micro.iteration = 1  # the boundary is micro-batch 0, the larger one
    assert micro.boundary() is micro.parts[0] and micro.join_target() is micro.parts[0]
    assert micro.join_room(2) == 0  # its share of 6 rows is 3: it has them
    assert micro.join_room(3) == 1  # of 7, 4
    micro.advance()
    assert micro.boundary() is micro.parts[1] and micro.join_target() is micro.parts[1]
    assert micro.join_room(2) == 2  # its share of 6 rows is 3: it has 1
    assert micro.rows_elsewhere() == 3


def test_a_burst_joins_in_one_visit_of_each_boundary() -> None:
    """16 prefilled at once into an empty batch on 2 ranks: half start lockstep, the other half
    start the ring, and nothing is left waiting (one per boundary took 8 iterations)."""
    micro = MicroBatches(2)
    assert micro.join_target() is micro.parts[0] and micro.join_room(16) == 8
    micro.parts[0].rows = tuple(f"a{i}" for i in range(8))
    micro.advance()
    assert micro.lockstep and micro.join_target() is micro.parts[1] and micro.join_room(8) == 8
    micro.parts[1].rows = tuple(f"b{i}" for i in range(8))
    micro.advance()
    assert micro.iteration == 0 and micro.join_room(1) == 0  # filling: no boundary yet


@pytest.mark.parametrize("world", (2, 3))
def test_the_share_never_puts_a_micro_batch_more_than_one_row_above_the_even_split(world: int) -> None:
    for decoding in range(0, 12):
        for waiting in range(0, 12):
            micro = MicroBatches(world)
            micro.parts[0].rows = tuple(f"r{i}" for i in range(decoding))
            micro.iteration = world - 1  # the boundary is micro-batch 0
            assert micro.boundary() is micro.parts[0]
            joined = len(micro.parts[0].rows) + micro.join_room(waiting)
            assert joined <= max(decoding, -(-(decoding + waiting) // world))
