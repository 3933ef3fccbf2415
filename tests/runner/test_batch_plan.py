"""The continuous batch's pure decisions: the agreed vector and the next batch, as tables."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.batch_plan import PREPARING, AgreedStep, Proposal, StepLayout, delivers, delivery_interval
from runner.engine.step_plan import Composition, chunk_takers, next_composition


def _proposal(code: int) -> Proposal:
    return None if code == -2 else PREPARING if code == -1 else code


PROPOSALS = st.integers(-2, 50).map(_proposal)  # none, still preparing, or a cached length


def agreed(received: int, cancelled: tuple[bool, ...] = (), tokens: tuple[int, ...] = (), slots: int = 4) -> AgreedStep:
    pad = slots - len(cancelled)
    return AgreedStep(received, cancelled + (False,) * pad, tokens + (0,) * (slots - len(tokens)))


def test_layout_sums_to_counts_votes_and_the_sampling_ranks_tokens() -> None:
    layout = StepLayout(world=3, max_batch=2)
    vectors = [
        layout.encode(0, 5, [False, True], []),
        layout.encode(1, 4, [False, False], []),
        layout.encode(2, 6, [True, False], [17, 42]),
    ]
    summed = [sum(column) for column in zip(*vectors, strict=True)]
    assert layout.decode(summed) == AgreedStep(
        received=4,
        cancelled=(True, True),
        tokens=(17, 42),
        cached=(0, 0),
        runnable=(False, False),
        prepared=(True, True),
    )  # no rank proposed: nothing pending


def test_layout_refuses_more_slots_than_max_batch_and_a_wrong_length() -> None:
    layout = StepLayout(world=1, max_batch=2)
    with pytest.raises(ValueError, match="max_batch=2"):
        layout.encode(0, 0, [False] * 3, [])
    with pytest.raises(ValueError, match="expected 9"):
        layout.decode([0, 0])


def test_layout_agrees_on_rank_0s_pace_alone() -> None:
    """Every rank measures its own pace; only rank 0's reaches the agreement, so every rank sizes a
    newcomer's chunks from the same number."""
    layout = StepLayout(world=3, max_batch=2)
    vectors = [layout.encode(rank, 1, [False], [], decode_share=100 * (rank + 1)) for rank in range(3)]
    summed = [sum(column) for column in zip(*vectors, strict=True)]
    assert layout.decode(summed, 1).decode_share == 100
    silent = [layout.encode(rank, 1, [], []) for rank in range(3)]  # rank 0 has measured nothing yet
    assert layout.decode([sum(column) for column in zip(*silent, strict=True)]).decode_share == 0


def test_layout_agrees_on_the_least_kv_capacity() -> None:
    """Ranks hold different layers and memory: each writes its own capacity, the batch takes the
    least, the same number on every rank (and the slot never overflows, whatever a rank says)."""
    layout = StepLayout(world=3, max_batch=2)
    vectors = [layout.encode(r, 1, [], [], kv_capacity=c) for r, c in enumerate([9000, 4000, 1 << 40])]
    assert layout.decode([sum(column) for column in zip(*vectors, strict=True)]).kv_capacity == 4000
    assert max(layout.encode(0, 1, [], [], kv_capacity=1 << 40)) < 1 << 31


@pytest.mark.parametrize(
    ("case", "current", "step", "stopped", "done", "pending", "expected_rows", "expected_prefilling", "kept"),
    [
        ("idle admits in log order", Composition(), agreed(2), set(), set(), ["a", "b", "c"], (), ("a", "b"), ()),
        ("only what every rank read", Composition(admitted=1), agreed(2), set(), set(), ["b", "c"], (), ("b",), ()),
        (
            "room is the limit",
            Composition(rows=("a", "b", "c"), admitted=3),
            agreed(5),
            set(),
            set(),
            ["d", "e"],
            ("a", "b", "c"),
            ("d",),
            (0, 1, 2),
        ),
        (
            "a finished row frees its slot at once",
            Composition(rows=("a", "b", "c", "d"), admitted=4),
            agreed(5),
            {"b"},
            set(),
            ["e"],
            ("a", "c", "d"),
            ("e",),
            (0, 2, 3),
        ),
        (
            "the prefilled head joins last",
            Composition(rows=("a",), prefilling=("b", "c"), admitted=3),
            agreed(3),
            set(),
            {"b"},
            [],
            ("a", "b"),
            ("c",),
            (0,),
        ),
        (
            "prefilled streams join together, in order",
            Composition(rows=("a",), prefilling=("b", "c", "d"), admitted=4),
            agreed(4),
            set(),
            {"d", "b"},
            [],
            ("a", "b", "d"),
            ("c",),
            (0,),
        ),
        (
            "no more than the join room",
            Composition(prefilling=("b", "c", "d"), admitted=3),
            agreed(3),
            set(),
            {"b", "c", "d"},
            [],
            ("b", "c"),
            ("d",),
            (),
        ),
        (
            "a cancelled row leaves, the others stay",
            Composition(rows=("a", "b", "c"), admitted=3),
            agreed(3, (False, True)),
            set(),
            set(),
            [],
            ("a", "c"),
            (),
            (0, 2),
        ),
        (
            "a cancelled prefilled stream never joins",
            Composition(rows=("a",), prefilling=("b", "c"), admitted=3),
            agreed(3, (False, True)),
            set(),
            {"b", "c"},
            [],
            ("a", "c"),
            (),
            (0,),
        ),
        (
            "a quiet step keeps every row",
            Composition(rows=("a", "b"), admitted=2),
            agreed(2),
            set(),
            set(),
            [],
            ("a", "b"),
            (),
            (0, 1),
        ),
        (
            "cancel wins over a stop rule",
            Composition(rows=("a",), admitted=1),
            agreed(1, (True,)),
            {"a"},
            set(),
            [],
            (),
            (),
            (),
        ),
    ],
)
def test_next_composition(
    case: str,
    current: Composition,
    step: AgreedStep,
    stopped: set[str],
    done: set[str],
    pending: list[str],
    expected_rows: tuple[str, ...],
    expected_prefilling: tuple[str, ...],
    kept: tuple[int, ...],
) -> None:
    transition = next_composition(
        current,
        step,
        stopped_rows=frozenset(stopped),
        prefilled=frozenset(done),
        join_room=2,
        pending=pending,
        max_batch=4,
    )
    assert transition.composition.rows == expected_rows, case
    assert transition.composition.prefilling == expected_prefilling, case
    assert transition.kept_rows == kept, case
    assert transition.composition.admitted == current.admitted + len(transition.newcomers), case


def test_cancel_and_finish_are_reported_apart() -> None:
    current = Composition(rows=("a", "b"), prefilling=("c",), admitted=3)
    transition = next_composition(
        current,
        agreed(3, (True, False, True)),
        stopped_rows=frozenset({"a", "b"}),
        prefilled=frozenset("c"),
        join_room=1,
        pending=[],
        max_batch=4,
    )
    assert transition.cancelled == ("a", "c")
    assert transition.finished == ("b",)
    assert transition.joined == ()


@pytest.mark.parametrize(("current", "pending"), [(Composition(), ["a"]), (Composition(rows=("a",), admitted=1), [])])
def test_a_rank_that_holds_fewer_assignments_than_agreed_is_an_error(current: Composition, pending: list[str]) -> None:
    with pytest.raises(ValueError, match="holds 1"):
        next_composition(
            current,
            agreed(2),
            stopped_rows=frozenset(),
            prefilled=frozenset(),
            join_room=1,
            pending=pending,
            max_batch=4,
        )


@given(
    world=st.integers(1, 3),
    data=st.data(),
)
def test_decoding_only_the_slots_in_use_agrees_with_decoding_them_all(world: int, data: st.DataObject) -> None:
    """A step decodes the slots and pending assignments it filled (its cost follows the batch, not
    max_batch): the same values as the full decode, cut to those."""
    layout = StepLayout(world=world, max_batch=4)
    slots, pending = data.draw(st.integers(0, 4)), data.draw(st.integers(0, 6))
    vectors = [
        layout.encode(
            rank,
            data.draw(st.integers(0, 9)),
            data.draw(st.lists(st.booleans(), min_size=slots, max_size=slots)),
            data.draw(st.lists(st.integers(0, 99), min_size=slots, max_size=slots)) if rank == world - 1 else [],
            data.draw(
                st.lists(
                    PROPOSALS,
                    min_size=min(pending, 4),
                    max_size=min(pending, 4),
                )
            ),
        )
        for rank in range(world)
    ]
    summed = [sum(column) for column in zip(*vectors, strict=True)]
    full, cut = layout.decode(summed), layout.decode(summed, slots, pending)
    assert cut.received == full.received
    assert (cut.cancelled, cut.tokens) == (full.cancelled[:slots], full.tokens[:slots])
    assert (cut.cached, cut.runnable) == (full.cached[:pending], full.runnable[:pending])
    assert cut.prepared == full.prepared[:pending]


def test_without_drops_newcomers_that_failed_validation() -> None:
    current = Composition(rows=("a",), prefilling=("b", "c"), admitted=3)
    assert current.without(["b"]) == Composition(rows=("a",), prefilling=("c",), admitted=3)


@given(
    counts=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    extra=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    votes=st.lists(st.booleans(), min_size=4, max_size=4),
    stopped=st.sets(st.sampled_from("abcdefg")),
    done=st.sets(st.sampled_from("y")),
    join_room=st.integers(0, 2),
)
def test_every_rank_derives_the_same_batch_whatever_it_read_beyond_the_minimum(
    counts: list[int], extra: list[int], votes: list[bool], stopped: set[str], done: set[str], join_room: int
) -> None:
    """Ranks read different numbers of assignments; the batch they derive never depends on it."""
    log = list("abcdefghijklmnop")
    current = Composition(rows=("x",), prefilling=("y",), admitted=0)
    step = AgreedStep(min(counts), tuple(votes), (0, 0, 0, 0))
    frozen = frozenset(stopped)
    results = {
        next_composition(
            current,
            step,
            stopped_rows=frozen,
            prefilled=frozenset(done),
            join_room=join_room,
            pending=log[: n + e],
            max_batch=4,
        )
        for n, e in zip(counts, extra, strict=False)
    }
    assert len(results) == 1
    (transition,) = results
    assert len(transition.composition.members) <= 4
    assert transition.composition.admitted <= min(counts)


@pytest.mark.parametrize(
    ("case", "next_chunks", "budget", "expected"),
    [
        ("nothing to prefill", [None, None], 256, ()),
        ("short prompts share the step", [50, 50, 50, 50, 50, 50], 256, (0, 1, 2, 3, 4)),
        ("the first always takes its chunk", [256, 50], 256, (0,)),
        ("the first with a chunk, past the prefilled ones", [None, 300, 10], 256, (1,)),
        ("a later short chunk fills the room a long one left", [200, 100, 40], 256, (0, 2)),
    ],
)
def test_chunk_takers(case: str, next_chunks: list[int | None], budget: int, expected: tuple[int, ...]) -> None:
    assert chunk_takers(next_chunks, budget) == expected, case


@given(st.lists(st.one_of(st.none(), st.integers(1, 300)), max_size=8), st.integers(1, 256))
def test_a_steps_prefill_stays_within_one_chunk_of_the_budget(next_chunks: list[int | None], budget: int) -> None:
    """The step's prefill tokens exceed the budget only by the first chunk taken alone."""
    takers = chunk_takers(next_chunks, budget)
    chunks = [next_chunks[i] or 0 for i in takers]
    assert len(takers) > 0 or all(c is None for c in next_chunks)
    assert len(takers) <= 1 or sum(chunks) <= budget


@pytest.mark.parametrize(("rows", "interval"), [(1, 1), (4, 1), (7, 1), (8, 2), (16, 4), (32, 8)])
def test_a_full_batch_publishes_a_few_chunks_per_step(rows: int, interval: int) -> None:
    assert delivery_interval(rows, 4) == interval
    assert delivery_interval(rows, 32) == 1  # batch_chunk_events_per_round >= max_batch: every token
    steps = range(64)
    delivered = [s for s in steps if delivers(s, rows, 4, text_shown=s > 0)]
    assert delivered == list(range(0, 64, interval))  # the first token at once


def test_a_fast_stream_sends_its_tokens_a_few_at_a_time() -> None:
    """5 ms per token against an 8 ms floor: the first token at once, then every other one; a stream
    of 40 ms per token sends each token; a floor of 0 changes nothing."""
    per_token, floor, last, sent = 0.005, 0.008, 0.0, []
    for step in range(9):
        now = step * per_token
        if delivers(step, 1, 4, now - last, floor, text_shown=step > 0):
            sent.append(step)
            last = now
    assert sent == [0, 2, 4, 6, 8]
    assert all(delivers(step, 1, 4, 0.040, floor, text_shown=step > 0) for step in range(9))
    assert [s for s in range(64) if delivers(s, 16, 4, 0.0, 0.0, text_shown=s > 0)] == list(range(0, 64, 4))
    assert not delivers(4, 16, 4, 0.001, floor, text_shown=True)  # the round's turn, but too soon: held
    assert delivers(4, 16, 4, 0.001, floor, text_shown=False)  # no text shown yet: at once, whatever the rhythm


def test_an_assignment_a_rank_still_prepares_is_agreed_as_not_prepared_on_every_rank() -> None:
    """Rank 1 still compiles the second assignment's grammar: every rank reads it as not prepared
    (and runnable: nothing says it cannot run); a 0 from any rank still makes it unrunnable."""
    layout = StepLayout(world=2, max_batch=3)
    vectors = [
        layout.encode(0, 3, [], [], [4, 0, None]),
        layout.encode(1, 3, [], [], [4, PREPARING, PREPARING]),
    ]
    step = layout.decode([sum(column) for column in zip(*vectors, strict=True)], 0, 3)
    assert step.cached == (4, 0, 0)
    assert step.runnable == (True, True, False)
    assert step.prepared == (True, False, False)


@pytest.mark.parametrize(
    ("prepared", "joining"),
    [
        ((True, True, True), ("a", "b", "c")),
        ((True, False, True), ("a", "c")),  # "c" passes "b", whose grammar still compiles
        ((False, True, True), ("b", "c")),
        ((False, False, False), ()),
        ((), ("a", "b", "c")),  # a step that carries no preparation (one rank, old callers)
    ],
)
def test_newcomers_join_in_log_order_past_one_still_preparing(
    prepared: tuple[bool, ...], joining: tuple[str, ...]
) -> None:
    """A newcomer whose grammar still compiles on some rank waits alone; the ready ones after it
    in the log join past it, and the decoding rows run on untouched."""
    current = Composition(rows=("x",), admitted=0)
    step = AgreedStep(3, (False,), (7,), cached=(0, 0, 0), runnable=(True, True, True), prepared=prepared)
    transition = next_composition(
        current,
        step,
        stopped_rows=frozenset(),
        prefilled=frozenset(),
        join_room=0,
        pending=["a", "b", "c"],
        max_batch=8,
    )
    assert transition.newcomers == joining
    assert transition.composition.rows == ("x",)
    assert transition.composition.admitted == len(joining)


def test_one_still_preparing_joins_at_the_next_room_before_later_ones() -> None:
    """Passed while it prepared, it is still first in the log's order once ready: with room for one,
    it takes it before anything read after it."""
    current = Composition(rows=("x", "y", "c"), admitted=2)  # "c" passed "b" at an earlier step
    step = AgreedStep(4, (False, False, False), (7, 7, 7), cached=(0, 0), runnable=(True, True), prepared=(True, True))
    transition = next_composition(
        current,
        step,
        stopped_rows=frozenset({"x"}),
        prefilled=frozenset(),
        join_room=0,
        pending=["b", "d"],
        max_batch=3,
    )
    assert transition.newcomers == ("b",)
    assert transition.composition.admitted == 3


@given(
    log_length=st.integers(0, 8),
    data=st.data(),
)
def test_ranks_that_admitted_past_a_preparing_one_still_agree_on_every_step(
    log_length: int, data: st.DataObject
) -> None:
    """Steps of a batch whose assignments prepare for random lengths of time, on ranks that read
    the log at random paces: at every step each rank derives the same transition from the agreed
    data, whatever it read beyond it, each assignment joins exactly once, and none joins before
    every rank holds it and has it ready; once the log is read and rows finish, every one has joined."""
    log = [f"t{i}" for i in range(log_length)]
    world = data.draw(st.integers(1, 3))
    ready_at = {t: data.draw(st.integers(0, 6)) for t in log}  # the step from which every rank has it ready
    max_batch = data.draw(st.integers(1, 4))
    compositions = [Composition() for _ in range(world)]
    read = [0] * world
    joined: list[str] = []
    for step_index in range(40):
        settling = step_index >= 10  # every rank has read the whole log, and every row finishes
        read = [log_length if settling else min(log_length, r + data.draw(st.integers(0, 2))) for r in read]
        received = min(read)
        pendings = [[t for t in log[: read[r]] if t not in joined] for r in range(world)]
        shown = min(len(p) for p in pendings)  # the pending assignments every rank proposed for
        prepared = tuple(ready_at[t] <= step_index for t in pendings[0][: min(shown, max_batch)])
        rows = compositions[0].rows
        stopped = frozenset(rows if settling or not rows else data.draw(st.sets(st.sampled_from(rows))))
        agreed_step = AgreedStep(received, (False,) * len(compositions[0].members), (0,) * len(rows), prepared=prepared)
        transitions = {
            next_composition(
                compositions[r],
                agreed_step,
                stopped_rows=stopped,
                prefilled=frozenset(compositions[r].prefilling),
                join_room=max_batch,
                pending=pendings[r],
                max_batch=max_batch,
            )
            for r in range(world)
        }
        assert len(transitions) == 1
        (transition,) = transitions
        assert all(ready_at[t] <= step_index and log.index(t) < received for t in transition.newcomers)
        assert not set(transition.newcomers) & set(joined)
        assert list(transition.newcomers) == sorted(transition.newcomers, key=log.index)
        joined += transition.newcomers
        compositions = [transition.composition] * world
        assert transition.composition.admitted == len(joined)
        assert len(transition.composition.members) <= max_batch
    assert joined == sorted(joined, key=log.index) or any(ready_at[t] > 0 for t in log)  # passing needs a wait
    assert sorted(joined) == sorted(log)
