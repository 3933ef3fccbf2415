"""Table tests for the pure fold: one case per event kind, plus every named error."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from events.apply import (
    ApplyError,
    InvalidEvent,
    SequenceGap,
    UnknownInstance,
    UnknownNode,
    UnknownTask,
    apply,
)
from events.catalogue import (
    InstanceRetired,
    LogEvent,
    NodeLeft,
    NodeTimedOut,
    TaskCancelled,
    TaskCompleted,
    TaskFailed,
    TaskStalled,
    Usage,
)
from events.codec import ExportRecord, encode_record
from events.fold import fold
from events.ids import InstanceId, NodeId, TaskId
from events.state import State, canonical_bytes
from tests.events.builders import Events

ROOT = Path(__file__).resolve().parents[2]


def _fold(events: Sequence[LogEvent]) -> State:
    return fold(enumerate(events, start=1))


@pytest.fixture
def ev() -> Events:
    return Events()


def _cluster(ev: Events) -> list[LogEvent]:
    """Two nodes, one 2-rank instance with both runners ready, one assigned task."""
    return [
        ev.node("n1"),
        ev.node("n2"),
        ev.placed("i1"),
        ev.runner(0, "ready"),
        ev.runner(1, "ready"),
        ev.created("t1"),
        ev.assigned("t1", "i1"),
    ]


def test_nodes_join_leave_and_time_out(ev: Events) -> None:
    s = _fold(
        [
            ev.node("n1"),
            ev.node("n2"),
            NodeLeft(env=ev.worker("n1").stamp(), node_id=NodeId("n1"), reason="shutdown"),
            NodeTimedOut(env=ev.master.stamp(), node_id=NodeId("n2"), last_seen=5),
        ]
    )
    assert s.nodes["n1"].status == "left" and s.nodes["n1"].reason == "shutdown"
    assert s.nodes["n2"].status == "timed_out"
    assert s.last_seq == 4
    rejoined = apply(s, 5, ev.node("n1"))
    assert rejoined.nodes["n1"].status == "up"


def test_placement_and_runner_readiness(ev: Events) -> None:
    s = _fold([ev.node("n1"), ev.node("n2"), ev.placed("i1")])
    instance = s.instances["i1"]
    assert instance.world_size == 2 and not instance.ready
    assert [r.status for r in instance.runners] == ["placed", "placed"]
    s = apply(s, 4, ev.runner(0, "ready"))
    assert not s.instances["i1"].ready
    s = apply(s, 5, ev.runner(1, "ready"))
    assert s.instances["i1"].ready
    s = apply(s, 6, ev.runner(1, "failed"))
    assert s.instances["i1"].failed and not s.instances["i1"].ready
    s = apply(s, 7, InstanceRetired(env=ev.master.stamp(), instance_id=InstanceId("i1"), reason="rank 1 failed"))
    assert s.instances["i1"].retired and s.instances["i1"].retire_reason == "rank 1 failed"


def test_task_lifecycle_through_prefill_and_decode(ev: Events) -> None:
    events = [
        *_cluster(ev),
        ev.started("t1", rank=0),
        ev.started("t1", rank=1),
        ev.progress("t1", rank=0, processed=128, iteration=0),
        ev.progress("t1", rank=1, processed=128, iteration=1),
        ev.chunk("t1", 0, "Hel", tokens=2),
        ev.chunk("t1", 2, "lo", tokens=1),
    ]
    s = _fold(events)
    task = s.tasks["t1"]
    assert task.status == "decoding"
    assert task.instance_id == "i1" and s.instances["i1"].queue == ("t1",)
    assert set(task.prefill) == {0, 1}
    assert task.progress[1].iteration == 1 and task.progress[0].processed == 128
    assert task.text == "Hello" and task.completion_tokens == 3 and task.chunks == 2
    usage = Usage(prompt_tokens=512, completion_tokens=3)
    done = apply(
        s,
        len(events) + 1,
        TaskCompleted(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), finish_reason="stop", usage=usage),
    )
    assert done.tasks["t1"].status == "completed" and done.tasks["t1"].usage == usage
    assert done.instances["i1"].queue == ()


def test_cancel_then_cancelled_completion(ev: Events) -> None:
    events = [*_cluster(ev), TaskCancelled(env=ev.api.stamp(), task_id=TaskId("t1"), reason="client_disconnect")]
    s = _fold(events)
    assert s.tasks["t1"].cancel_reason == "client_disconnect" and not s.tasks["t1"].ended
    s = apply(
        s,
        s.last_seq + 1,
        TaskCompleted(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), finish_reason="cancelled"),
    )
    assert s.tasks["t1"].status == "cancelled" and s.tasks["t1"].ended


def test_stall_then_failure(ev: Events) -> None:
    s = _fold(
        [
            *_cluster(ev),
            TaskStalled(env=ev.master.stamp(), task_id=TaskId("t1"), diagnosis="rank 1 silent for 30s"),
            TaskFailed(env=ev.master.stamp(), task_id=TaskId("t1"), error="stalled", rank=1),
        ]
    )
    task = s.tasks["t1"]
    assert task.stalled == "rank 1 silent for 30s"
    assert task.status == "failed" and task.failed_rank == 1 and task.error == "stalled"


def test_late_events_after_the_end_change_nothing_but_the_sequence(ev: Events) -> None:
    s = _fold([*_cluster(ev), TaskFailed(env=ev.master.stamp(), task_id=TaskId("t1"), error="watchdog")])
    before = s.tasks["t1"]
    late = [
        ev.progress("t1", rank=1),
        ev.chunk("t1"),
        ev.started("t1"),
        TaskCancelled(env=ev.api.stamp(), task_id=TaskId("t1"), reason="api"),
        TaskCompleted(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), finish_reason="stop"),
        TaskStalled(env=ev.master.stamp(), task_id=TaskId("t1"), diagnosis="x"),
        ev.assigned("t1", "i1"),
    ]
    for event in late:
        s = apply(s, s.last_seq + 1, event)
    assert s.tasks["t1"] == before
    assert s.last_seq == len(_cluster(Events())) + 1 + len(late)


@pytest.mark.parametrize(
    ("make_bad", "error"),
    [
        (lambda ev: ev.progress("ghost"), UnknownTask),
        (lambda ev: ev.chunk("ghost"), UnknownTask),
        (lambda ev: ev.started("ghost"), UnknownTask),
        (lambda ev: ev.assigned("ghost", "i1"), UnknownTask),
        (lambda ev: ev.assigned("t1", "nope"), UnknownInstance),
        (lambda ev: TaskCancelled(env=ev.api.stamp(), task_id=TaskId("ghost"), reason="api"), UnknownTask),
        (lambda ev: TaskCompleted(env=ev.master.stamp(), task_id=TaskId("ghost"), finish_reason="stop"), UnknownTask),
        (lambda ev: TaskFailed(env=ev.master.stamp(), task_id=TaskId("ghost"), error="x"), UnknownTask),
        (lambda ev: TaskStalled(env=ev.master.stamp(), task_id=TaskId("ghost"), diagnosis="x"), UnknownTask),
        (lambda ev: ev.runner(0, "ready", instance_id="nope"), UnknownInstance),
        (
            lambda ev: InstanceRetired(env=ev.master.stamp(), instance_id=InstanceId("nope"), reason="x"),
            UnknownInstance,
        ),
        (lambda ev: NodeLeft(env=ev.worker("ghost").stamp(), node_id=NodeId("ghost"), reason="x"), UnknownNode),
        (lambda ev: NodeTimedOut(env=ev.master.stamp(), node_id=NodeId("ghost"), last_seen=0), UnknownNode),
        (lambda ev: ev.placed("i2", nodes=("n1", "ghost")), UnknownNode),
        (lambda ev: ev.placed("i1"), InvalidEvent),
        (lambda ev: ev.created("t1"), InvalidEvent),
        (lambda ev: ev.assigned("t1", "i1"), InvalidEvent),
        (lambda ev: ev.runner(2, "ready"), InvalidEvent),
    ],
)
def test_named_errors(ev: Events, make_bad: object, error: type[ApplyError]) -> None:
    s = _fold(_cluster(ev))
    with pytest.raises(error):
        apply(s, s.last_seq + 1, make_bad(ev))  # pyright: ignore[reportCallIssue]


def test_placement_with_missing_ranks_is_invalid(ev: Events) -> None:
    s = _fold([ev.node("n1"), ev.node("n2")])
    placed = ev.placed("i1")
    broken = type(placed)(**{**{f: getattr(placed, f) for f in placed.__struct_fields__}, "ring_hosts": ["h:1"]})
    with pytest.raises(InvalidEvent, match="one ring host each"):
        apply(s, 3, broken)


@pytest.mark.parametrize("seq", [0, 1, 3, 100])
def test_sequence_gaps_and_repeats_are_named_errors(ev: Events, seq: int) -> None:
    s = _fold([ev.node("n1")])
    with pytest.raises(SequenceGap) as info:
        apply(s, seq, ev.node("n2"))
    assert info.value.expected == 2 and info.value.got == seq


def test_a_trimmed_stream_starts_from_its_first_sequence(ev: Events) -> None:
    s = apply(State.starting_before(500), 500, ev.node("n1"))
    assert s.last_seq == 500


def test_apply_never_mutates_its_input(ev: Events) -> None:
    events = _cluster(ev)
    before = _fold(events)
    snapshot = canonical_bytes(before)
    apply(before, before.last_seq + 1, ev.progress("t1", rank=0))
    apply(before, before.last_seq + 1, ev.chunk("t1"))
    assert canonical_bytes(before) == snapshot


_FOLD_IN_A_CHILD = """
import sys
from events.fold import fold
from events.codec import decode_record
from events.state import canonical_bytes
records = [decode_record(line) for line in sys.stdin.buffer.read().splitlines()]
sys.stdout.buffer.write(canonical_bytes(fold((r.seq, r.event) for r in records)))
"""


def test_canonical_bytes_of_a_busy_state_are_the_same_in_other_processes(ev: Events) -> None:
    """The promise is "equal folds give equal bytes in any process": other hash seeds included."""
    events = [*_cluster(ev), ev.started("t1", 1), ev.progress("t1", rank=1), ev.progress("t1", rank=0), ev.chunk("t1")]
    here = canonical_bytes(_fold(events))
    assert b'"progress":{"1":' in here
    export = b"\n".join(encode_record(ExportRecord(stream="events", seq=i, event=e)) for i, e in enumerate(events, 1))
    for seed in ("1", "2"):
        child = subprocess.run(
            [sys.executable, "-c", _FOLD_IN_A_CHILD],
            input=export,
            capture_output=True,
            check=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert child.stdout == here


def test_canonical_bytes_ignore_insertion_order(ev: Events) -> None:
    a = _fold([ev.node("n1"), ev.node("n2")])
    other = Events()
    b = fold([(1, other.node("n2")), (2, other.node("n1"))])
    assert canonical_bytes(a).count(b'"node_id"') == canonical_bytes(b).count(b'"node_id"') == 2
    assert list(canonical_bytes(a).split(b'"nodes"')[1][:40]) == list(canonical_bytes(b).split(b'"nodes"')[1][:40])
