"""`Folder` is only a faster `apply`: on any log, prefix, or error it gives the same State, and
both quarantine the same poison the same way."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.apply import ForbiddenOrigin, Misrouted, SequenceGap, UnknownTask
from events.catalogue import (
    ChunkGenerated,
    Envelope,
    InstancePlaced,
    LogEvent,
    NodeLeft,
    Origin,
    PrefillProgress,
    TaskCancelled,
    TaskCompleted,
    TaskFailed,
)
from events.fold import Folder, apply_live, apply_or_quarantine, fold
from events.ids import EventId, InstanceId, NodeId, TaskId
from events.state import QUARANTINE_KEPT, State, canonical_bytes
from events.subjects import subject_for
from events.synthetic import synthetic_history
from tests.events.builders import Events

HISTORY = synthetic_history(3000)


def _env(service: str, node: str = "", rank: int | None = None) -> Envelope:
    return Envelope(
        event_id=EventId("forged"), origin=Origin(service=service, node=node, rank=rank), wall_time=1, mono_ns=1
    )


# Events the fold refuses wherever they land in HISTORY: a forged origin or an id nothing knows,
# on the hot path (progress, chunks) and off it.
POISON: tuple[LogEvent, ...] = (
    ChunkGenerated(env=_env("runner", "node-b", 1), task_id=TaskId("ghost"), index=0, text="x", token_ids=[1]),
    ChunkGenerated(env=_env("api"), task_id=TaskId("task-00000001"), index=0, text="x", token_ids=[1]),
    PrefillProgress(
        env=_env("runner", "node-z", 0), task_id=TaskId("task-00000001"), rank=0, processed=1, total=2, iteration=0
    ),
    InstancePlaced(env=_env("api"), instance_id=InstanceId("inst-forged"), model="tiny", shards=[], ring_hosts=[]),
    TaskCancelled(env=_env("api"), task_id=TaskId("ghost"), reason="api"),
    NodeLeft(env=_env("worker", "node-b"), node_id=NodeId("node-a"), reason="forged"),
)


@st.composite
def poisoned_logs(draw: st.DrawFn) -> tuple[list[tuple[int, LogEvent]], int]:
    """A prefix of HISTORY with poison inserted at random places; the number inserted."""
    events = list(HISTORY[: draw(st.integers(min_value=0, max_value=len(HISTORY)))])
    inserts = draw(st.lists(st.tuples(st.integers(0, len(events)), st.sampled_from(POISON)), max_size=8))
    for at, poison in sorted(inserts, key=lambda pair: pair[0], reverse=True):
        events.insert(at, poison)
    return list(enumerate(events, start=1)), len(inserts)


# At most this many of an example's reads are compared with a sequential fold of the events so far
# (every read still happens): comparing at every read made reading after each event quadratic,
# 22-62 s of the suite.
COMPARED_READS = 12


@settings(max_examples=40, deadline=None)
@given(poisoned_logs(), st.integers(min_value=1, max_value=len(HISTORY)))
def test_folder_equals_the_sequential_fold_at_every_read(
    log: tuple[list[tuple[int, LogEvent]], int], read_every: int
) -> None:
    events, poisoned = log
    folder = Folder()
    reads = range(read_every, len(events) + 1, read_every)
    compared = set(reads[:: max(1, -(-len(reads) // COMPARED_READS))])  # each comparison folds from the start
    for i, (seq, event) in enumerate(events, start=1):
        folder.add(seq, event)
        if i % read_every == 0:  # reading .state mid-way must not change what follows
            state = folder.state
            if i in compared:
                assert canonical_bytes(state) == canonical_bytes(fold(events[:i]))
    assert canonical_bytes(folder.state) == canonical_bytes(fold(events))
    assert folder.state.quarantined_count == poisoned
    assert [q.seq for q in folder.state.quarantined] == sorted(q.seq for q in folder.state.quarantined)


def test_a_bad_hot_event_is_quarantined_and_changes_nothing_else() -> None:
    ev = Events()
    events = [ev.node("n1"), ev.node("n2"), ev.placed("i1"), ev.created("t1"), ev.assigned("t1", "i1"), ev.chunk("t1")]
    folder = Folder()
    folder.add_all(enumerate(events, start=1))
    events.append(ev.chunk("t1", index=1))
    folder.add(7, events[-1])  # hot: held in the folder's transient map, not yet in a State
    refused = folder.add(8, ev.chunk("ghost"))
    assert isinstance(refused, UnknownTask)
    forged = ChunkGenerated(env=ev.api.stamp(), task_id=TaskId("t1"), index=2, text="forged", token_ids=[9])
    assert isinstance(folder.add(9, forged), ForbiddenOrigin)
    state = folder.state
    assert state.last_seq == 9 and state.quarantined_count == 2
    assert [(q.seq, q.kind, q.error) for q in state.quarantined] == [
        (8, "chunk_generated", "UnknownTask"),
        (9, "chunk_generated", "ForbiddenOrigin"),
    ]
    assert state.tasks[TaskId("t1")].text == "hihi"  # the forged chunk never reached the task
    assert canonical_bytes(state) == canonical_bytes(fold(enumerate([*events, ev.chunk("ghost"), forged], start=1)))


def test_a_sequence_gap_still_raises_and_leaves_the_state_as_before() -> None:
    ev = Events()
    events = [ev.node("n1"), ev.node("n2"), ev.placed("i1"), ev.created("t1"), ev.assigned("t1", "i1"), ev.chunk("t1")]
    folder = Folder()
    folder.add_all(enumerate(events, start=1))
    with pytest.raises(SequenceGap):
        folder.add(9, ev.chunk("t1", index=1))
    assert canonical_bytes(folder.state) == canonical_bytes(fold(enumerate(events, start=1)))


def test_the_quarantine_is_bounded_but_counts_everything() -> None:
    poison = [(seq, POISON[4]) for seq in range(1, QUARANTINE_KEPT + 11)]
    state = fold(poison)
    assert state.quarantined_count == QUARANTINE_KEPT + 10
    assert len(state.quarantined) == QUARANTINE_KEPT
    assert state.quarantined[0].seq == 11 and state.quarantined[-1].seq == QUARANTINE_KEPT + 10
    assert Folder().add_all(poison) == state


def test_apply_live_quarantines_like_the_fold_and_returns_the_refusal() -> None:
    ev = Events()
    state = fold([(1, ev.node("n1"))])
    forged = NodeLeft(env=ev.worker("n2").stamp(), node_id=NodeId("n1"), reason="forged")
    live, error = apply_live(state, 5, forged)  # seqs 2-4: malformed messages, stepped over
    assert isinstance(error, ForbiddenOrigin)
    assert live.last_seq == 5 and live.quarantined[0].seq == 5
    assert live.nodes[NodeId("n1")].status == "up"
    repeated, error = apply_live(live, 5, forged)
    assert isinstance(error, SequenceGap) and repeated == live


def test_skip_to_accounts_for_missing_seqs() -> None:
    folder = Folder(State.starting_before(10))
    folder.skip_to(20)
    assert folder.last_seq == 19 and folder.state.last_seq == 19


def test_an_event_off_its_subject_is_quarantined_as_misrouted_by_folder_and_apply_live() -> None:
    """The subject is what the server checked against the publisher: node n1's runner (rank 0 of
    i1) may publish only subjects ending in n1, so a chunk claiming n2's rank 1 on such a subject
    is a forgery, however right its payload looks to the origin rules."""
    ev = Events()
    events = [ev.node("n1"), ev.node("n2"), ev.placed("i1"), ev.created("t1"), ev.assigned("t1", "i1"), ev.chunk("t1")]
    start = fold(enumerate(events, start=1))
    claims_rank1 = ev.chunk("t1", index=1, text="forged")  # stamped as n2's rank 1, the sampling rank
    on_n1 = "shoal.ev.task.t1.chunk_generated.n1"
    folder = Folder(start)
    refused = folder.add(7, claims_rank1, on_n1.encode())
    assert isinstance(refused, Misrouted) and "claiming node 'n2'" in str(refused)
    live, error = apply_live(start, 7, claims_rank1, on_n1)
    assert isinstance(error, Misrouted)
    for state in (folder.state, live):
        assert [(q.seq, q.error) for q in state.quarantined] == [(7, "Misrouted")]
        assert state.tasks[TaskId("t1")].text == "hi"  # the forged text never reached the task
    own = subject_for(claims_rank1)  # the same event where n2's runner publishes it is taken
    assert Folder(start).add(7, claims_rank1, own) is None
    assert apply_live(start, 7, claims_rank1, own)[1] is None


def test_the_sampling_rank_alone_reports_tokens_and_completes_a_task() -> None:
    """Node n1's runner holds rank 0 of t1's instance: it may report the task's prefill and fail
    it, but its chunks and its completion are refused (only the last rank samples)."""
    ev = Events()
    events = [ev.node("n1"), ev.node("n2"), ev.placed("i1"), ev.created("t1"), ev.assigned("t1", "i1")]
    start = fold(enumerate(events, start=1))
    rank0 = ev.rank("i1", 0)
    chunk = ChunkGenerated(env=rank0.stamp(), task_id=TaskId("t1"), index=0, text="forged", token_ids=[9])
    completed = TaskCompleted(env=rank0.stamp(), task_id=TaskId("t1"), finish_reason="stop")
    for event in (chunk, completed):
        folder = Folder(start)
        refused = folder.add(6, event, subject_for(event))  # on its own node's subject: the server let it through
        assert isinstance(refused, ForbiddenOrigin) and "sampling rank (1)" in str(refused)
        assert folder.state.tasks[TaskId("t1")].status == "assigned"
    failed = TaskFailed(env=rank0.stamp(), task_id=TaskId("t1"), error="rank 0 failed: OOM", rank=0)
    assert Folder(start).add(6, failed, subject_for(failed)) is None


def _fold_from_the_bus(events: list[tuple[int, LogEvent, str]]) -> State:
    state = State()
    for seq, event, subject in events:
        state, _error = apply_or_quarantine(state, seq, event, subject)
    return state


@settings(max_examples=30, deadline=None)
@given(poisoned_logs(), st.lists(st.integers(min_value=0, max_value=len(HISTORY)), max_size=6))
def test_folder_and_apply_quarantine_the_same_misrouted_events(
    log: tuple[list[tuple[int, LogEvent]], int], misrouted_at: list[int]
) -> None:
    """Each event read with its subject, some moved to another node's subject (what a forger on
    that node can publish): `Folder` and the plain fold quarantine exactly those as Misrouted."""
    events, _poisoned = log
    moved = {at for at in misrouted_at if at < len(events)}
    read = [
        (seq, event, f"{subject_for(event)}.node-x" if i in moved else subject_for(event))
        for i, (seq, event) in enumerate(events)
    ]
    folder = Folder()
    for seq, event, subject in read:
        folder.add(seq, event, subject.encode())
    expected = _fold_from_the_bus(read)
    assert canonical_bytes(folder.state) == canonical_bytes(expected)
    if expected.quarantined_count <= QUARANTINE_KEPT:  # every record kept: each moved event is one of them
        misrouted = {q.seq for q in expected.quarantined if q.error == "Misrouted"}
        assert misrouted == {read[at][0] for at in moved}
