"""Retention of ended tasks (`events.retention`) and snapshots (`events.snapshot`): every way of
folding a log — `fold`, `Folder`, `apply_live`, a snapshot plus its tail — holds the same State,
eviction only ever drops ended tasks, and late events about an evicted task stay harmless."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.apply import InvalidEvent, apply
from events.catalogue import ChunkGenerated, LogEvent, TaskCompleted, TaskCreated, TaskFailed, Usage
from events.fold import Folder, apply_live, fold
from events.ids import TaskId
from events.retention import live_tasks_of, with_finished_kept
from events.snapshot import SNAPSHOT_FORMAT, UnusableSnapshot, decode_snapshot, encode_snapshot
from events.stamp import Stamper
from events.state import State, canonical_bytes
from events.synthetic import synthetic_history

HISTORY = synthetic_history(3000)  # ~65 tasks, one after the other
TASKS = sorted({e.task_id for e in HISTORY if isinstance(e, TaskCreated)})
_LAST_RANK = next(e.env.origin for e in HISTORY if isinstance(e, ChunkGenerated))
_MASTER = Stamper(msgspec.structs.replace(_LAST_RANK, service="master", node="", rank=None), wall_ns=lambda: 5)
_RANK = Stamper(_LAST_RANK, wall_ns=lambda: 5)


def _late(kind: str, task_id: TaskId) -> LogEvent:
    """An event a real race produces after the task ended: a slow rank's chunk, a second end."""
    if kind == "chunk":
        return ChunkGenerated(env=_RANK.stamp(), task_id=task_id, index=99, text=" late", token_ids=[7])
    if kind == "failed":
        return TaskFailed(env=_MASTER.stamp(), task_id=task_id, error="watchdog: stalled")
    return TaskCompleted(env=_RANK.stamp(), task_id=task_id, finish_reason="stop", usage=Usage())


@st.composite
def logs_with_late_events(draw: st.DrawFn) -> list[tuple[int, LogEvent]]:
    """A prefix of HISTORY with late events about tasks that ended before them."""
    events = list(HISTORY[: draw(st.integers(min_value=0, max_value=len(HISTORY)))])
    for _ in range(draw(st.integers(0, 6))):
        ended_at = [i for i, e in enumerate(events) if isinstance(e, TaskCompleted)]
        if not ended_at:
            break
        end = draw(st.sampled_from(ended_at))
        at = draw(st.integers(end + 1, len(events)))
        kind = draw(st.sampled_from(("chunk", "failed", "completed")))
        events.insert(at, _late(kind, events[end].task_id))  # pyright: ignore[reportAttributeAccessIssue]
    return list(enumerate(events, start=1))


@settings(max_examples=40, deadline=None)
@given(logs_with_late_events(), st.integers(min_value=0, max_value=6))
def test_every_fold_holds_the_same_bounded_state(log: list[tuple[int, LogEvent]], kept: int) -> None:
    plain = fold(log, State.keeping(kept))
    folder = Folder(State.keeping(kept))
    folder.add_all(log)
    live = State.keeping(kept)
    for seq, event in log:
        live, _error = apply_live(live, seq, event)
    assert canonical_bytes(folder.state) == canonical_bytes(plain) == canonical_bytes(live)
    # Late events are races, never poison, unless the task was forgotten even as a tombstone
    # (`kept` more tasks ended before the late event, which the test's inserts allow).
    assert all(q.error == "UnknownTask" for q in plain.quarantined)
    assert kept > 0 or plain.quarantined_count == 0
    if kept:
        ended = [t for t in plain.tasks.values() if t.ended]
        assert len(ended) <= kept
        assert len(plain.finished.evicted) <= kept


@settings(max_examples=30, deadline=None)
@given(logs_with_late_events(), st.integers(min_value=1, max_value=6))
def test_eviction_only_drops_ended_tasks(log: list[tuple[int, LogEvent]], kept: int) -> None:
    bounded, unbounded = fold(log, State.keeping(kept)), fold(log, State.keeping(0))
    assert bounded.live_tasks == unbounded.live_tasks
    assert bounded.instances == unbounded.instances
    for task_id, task in unbounded.tasks.items():
        held = bounded.tasks.get(task_id)
        assert held == task if held is not None or not task.ended else True
        assert held is not None or task.ended
    assert [t.task_id for t in live_tasks_of(bounded)] == sorted(
        (t.task_id for t in unbounded.tasks.values() if not t.ended), key=lambda i: unbounded.tasks[i].created_seq
    )


@settings(max_examples=30, deadline=None)
@given(logs_with_late_events(), st.integers(min_value=0, max_value=6), st.data())
def test_a_snapshot_plus_its_tail_equals_the_full_fold(
    log: list[tuple[int, LogEvent]], kept: int, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(log)))
    snapshot = decode_snapshot(encode_snapshot(fold(log[:cut], State.keeping(kept)), "created-1"))
    assert snapshot.log_created == "created-1"
    assert snapshot.state.last_seq == cut
    restored = Folder(snapshot.state)
    restored.add_all(log[cut:])
    assert canonical_bytes(restored.state) == canonical_bytes(fold(log, State.keeping(kept)))


@pytest.mark.parametrize("kind", ["chunk", "failed", "completed"])
def test_a_late_event_about_a_tombstoned_task_only_advances_the_seq(kind: str) -> None:
    state = fold(list(enumerate(HISTORY, start=1)), State.keeping(2))
    tombstoned = next(iter(state.finished.evicted.keys()))
    assert tombstoned not in state.tasks
    after, error = apply_live(state, state.last_seq + 1, _late(kind, tombstoned))
    assert error is None
    assert after == msgspec.structs.replace(state, last_seq=state.last_seq + 1)
    folder = Folder(state)
    assert folder.add(state.last_seq + 1, _late(kind, tombstoned)) is None
    assert folder.state == after


def test_a_late_event_about_a_task_forgotten_even_as_a_tombstone_is_quarantined() -> None:
    log = list(enumerate(HISTORY, start=1))
    state = fold(log, State.keeping(2))
    forgotten = TASKS[0]
    assert forgotten not in state.tasks and forgotten not in state.finished.evicted
    late, error = apply_live(state, state.last_seq + 1, _late("chunk", forgotten))
    assert late.quarantined_count == 1 and error is not None


def test_a_tombstoned_task_cannot_be_created_again() -> None:
    state = fold(list(enumerate(HISTORY, start=1)), State.keeping(2))
    tombstoned = next(iter(state.finished.evicted.keys()))
    created = next(e for e in HISTORY if isinstance(e, TaskCreated))
    again = msgspec.structs.replace(created, task_id=tombstoned)
    with pytest.raises(InvalidEvent):
        apply(state, state.last_seq + 1, again)


@pytest.mark.parametrize("kept", [0, 1, 3, 50])
def test_a_changed_bound_gives_the_state_that_bound_folds_to(kept: int) -> None:
    """A snapshot written under another `finished_tasks_kept` is rebounded on load; the tasks it
    holds whole are then those the new bound would hold (the newest ended ones)."""
    log = list(enumerate(HISTORY, start=1))
    rebounded = with_finished_kept(fold(log, State.keeping(5)), kept)
    direct = fold(log, State.keeping(kept))
    if 0 < kept <= 5:  # 0 or a larger bound cannot bring evicted tasks back
        assert set(rebounded.tasks.keys()) == set(direct.tasks.keys())
    assert rebounded.finished.kept == kept
    assert rebounded.live_tasks == direct.live_tasks


def test_a_snapshot_of_another_format_or_garbage_is_unusable() -> None:
    state = fold(list(enumerate(HISTORY[:500], start=1)))
    good = encode_snapshot(state, "c")
    assert decode_snapshot(good).state == state
    other = msgspec.msgpack.encode({"format": SNAPSHOT_FORMAT + 1, "log_created": "c", "state": {}})
    with pytest.raises(UnusableSnapshot, match="format"):
        decode_snapshot(other)
    for corrupt in (b"", b"\xff\x00garbage", good[: len(good) // 2]):
        with pytest.raises(UnusableSnapshot):
            decode_snapshot(corrupt)
