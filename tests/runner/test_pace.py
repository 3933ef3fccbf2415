"""The pace of a batch's steps (`pace.StepPace`), pure: what a decode step costs against a prompt
chunk, from step periods alone, and the room it leaves a newcomer's chunk."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.pace import MAX_DECODE_SHARE, SHARE_SCALE, StepPace, chunk_room

pytestmark = pytest.mark.timeout(60)


def test_nothing_is_known_until_both_kinds_of_step_were_seen() -> None:
    pace = StepPace(1000.0)
    assert pace.decode_share() == 0
    pace.observe(0.100, rows=4, chunk_cost=1000.0)  # a mixed step first: the chunk's part is unknown
    assert pace.per_cost_s is None and pace.decode_share() == 0
    pace.observe(0.010, rows=4, chunk_cost=0.0)
    assert pace.decode_s == 0.010 and pace.decode_share() == 0
    pace.observe(0.0, rows=0, chunk_cost=0.0)  # an empty step teaches nothing
    assert pace.decode_s == 0.010


def test_the_share_is_the_decode_steps_time_over_a_chunks() -> None:
    pace = StepPace(1000.0)
    pace.observe(0.010, rows=4, chunk_cost=0.0)  # 10 ms of decode
    pace.observe(0.110, rows=4, chunk_cost=1000.0)  # + 100 ms for 1000 units of chunk cost
    assert pace.per_cost_s == pytest.approx(0.0001)
    assert pace.decode_share() == 100  # a tenth of a chunk
    assert chunk_room(pace.decode_share()) == pytest.approx(0.9)
    lone = StepPace(1000.0)
    lone.observe(0.100, rows=0, chunk_cost=1000.0)  # a chunk with no rows: its whole period
    lone.observe(0.020, rows=2, chunk_cost=0.0)
    assert lone.decode_share() == 200


def test_a_short_prompts_chunk_teaches_nothing() -> None:
    """Its time is mostly a forward's fixed overhead: learning from it would make every chunk look
    dearer, so a decode step's share would look smaller than it is."""
    pace = StepPace(1000.0)
    pace.observe(0.010, rows=4, chunk_cost=0.0)
    pace.observe(0.030, rows=4, chunk_cost=20.0)  # a 20-unit chunk: 1 ms per unit, 10x the full chunk's
    assert pace.per_cost_s is None
    pace.observe(0.060, rows=4, chunk_cost=500.0)  # half a chunk is enough
    assert pace.per_cost_s == pytest.approx(0.0001)


def test_periods_are_averaged_so_one_slow_step_moves_the_share_a_little() -> None:
    pace = StepPace(1000.0)
    pace.observe(0.010, rows=4, chunk_cost=0.0)
    pace.observe(0.110, rows=4, chunk_cost=1000.0)
    pace.observe(0.060, rows=4, chunk_cost=0.0)  # one step 6x slower (the machine was busy)
    assert 100 < pace.decode_share() < 250


@given(
    periods=st.lists(st.tuples(st.floats(0.0, 10.0), st.integers(0, 64), st.floats(0.0, 1e9)), min_size=0, max_size=40),
    cost=st.floats(0.0, 1e9),
)
def test_any_periods_give_a_share_within_bounds_and_a_room_of_at_least_half(
    periods: list[tuple[float, int, float]], cost: float
) -> None:
    pace = StepPace(cost)
    for period, rows, chunk in periods:
        pace.observe(period, rows, chunk)
    share = pace.decode_share()
    assert 0 <= share <= MAX_DECODE_SHARE * SHARE_SCALE
    assert 1 - MAX_DECODE_SHARE <= chunk_room(share) <= 1.0
    assert chunk_room(-5) == 1.0 and chunk_room(10**9) == 1 - MAX_DECODE_SHARE
