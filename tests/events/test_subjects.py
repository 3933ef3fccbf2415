"""`event_subjects_without`: a consumer filter that leaves out exactly the kinds asked for.

JetStream cannot exclude subjects, so the filter lists the kept ones; a kind added to the catalogue
and missing here would silently never reach a service that follows with it, hence these checks.

And `subject_for` / `route_refusal`: the subject of what a node publishes ends with that node (the
server checks it against the publisher's identity), and an event read from another subject than
its own is refused.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import assume, given, settings

from events.catalogue import (
    AnyEvent,
    ChunkGenerated,
    LogEvent,
    NodeHeartbeat,
    NodeJoined,
    Origin,
    PrefillProgress,
    RunnerHeartbeat,
    RunnerStatusChanged,
    TaskCompleted,
    TaskFailed,
)
from events.ids import ID_PATTERN, InstanceId, NodeId, TaskId
from events.stamp import Stamper
from events.subjects import TASK_EVENTS, event_subjects_without, route_refusal, subject_for
from tests.events.strategies import event_strategy
from tests.events.test_codec import _kinds  # pyright: ignore[reportPrivateUsage]
from tests.security.test_bus_permissions import matches


@settings(max_examples=400, deadline=None)  # a shared machine: timing is not what it checks
@given(event_strategy())
def test_every_log_event_not_skipped_matches_exactly_one_filter(event: AnyEvent) -> None:
    if type(event) not in _kinds(LogEvent):
        return
    assume(not event.env.origin.node or re.match(ID_PATTERN, event.env.origin.node))  # node ids are tokens
    subject = subject_for(event)
    for skipped in ((), (ChunkGenerated,), (ChunkGenerated, PrefillProgress)):
        hits = [pattern for pattern in event_subjects_without(*skipped) if matches(pattern, subject)]
        assert len(hits) == (0 if type(event) in skipped else 1), (subject, hits)


def test_the_filters_are_disjoint_as_jetstream_requires() -> None:
    patterns = event_subjects_without(ChunkGenerated)
    for a, b in itertools.combinations(patterns, 2):
        assert not matches(a, b.replace("*", "x")) and not matches(b, a.replace("*", "x")), (a, b)


def test_task_events_are_every_kind_on_a_task_subject() -> None:
    on_task = {kind for kind in _kinds(LogEvent) if "task_id" in kind.__struct_fields__}
    assert set(TASK_EVENTS) == on_task


RANK_N1 = Origin(service="runner", node="n1", rank=1)
WORKER_N1 = Origin(service="worker", node="n1")
MASTER = Origin(service="master")
T1, I1 = TaskId("t1"), InstanceId("i1")


NO_NODE = Origin(service="runner", rank=1)  # an older log's runner, before origins named their node


def _chunk(origin: Origin, task: TaskId = T1) -> ChunkGenerated:
    return ChunkGenerated(env=Stamper(origin).stamp(), task_id=task, index=0, text="x", token_ids=[1])


def _progress(origin: Origin) -> PrefillProgress:
    return PrefillProgress(env=Stamper(origin).stamp(), task_id=T1, rank=1, processed=1, total=2, iteration=0)


def test_a_nodes_events_end_with_its_node_and_the_control_planes_with_their_kind() -> None:
    assert subject_for(_chunk(RANK_N1)) == "shoal.ev.task.t1.chunk_generated.n1"
    failed = TaskFailed(env=Stamper(MASTER).stamp(), task_id=T1, error="x")
    assert subject_for(failed) == "shoal.ev.task.t1.failed"
    status = RunnerStatusChanged(env=Stamper(WORKER_N1).stamp(), instance_id=I1, rank=0, status="failed")
    assert subject_for(status) == "shoal.ev.instance.i1.runner_status_changed.n1"
    beat = RunnerHeartbeat(env=Stamper(RANK_N1).stamp(), instance_id=I1, rank=1, phase="idle")
    assert subject_for(beat) == "shoal.hb.runner.i1.1.n1"
    joined = NodeJoined(
        env=Stamper(WORKER_N1).stamp(),
        node_id=NodeId("n1"),
        host="h",
        cores=1,
        memory_bytes=1,
        backend="cpu",
        version="v",
    )
    assert subject_for(joined) == "shoal.ev.node.n1.joined"  # the node is the subject already


ROUTES = [
    ("its own subject", _chunk(RANK_N1), "shoal.ev.task.t1.chunk_generated.n1", None),
    ("an older log's subject (no node token)", _chunk(RANK_N1), "shoal.ev.task.t1.chunk_generated", None),
    ("another node's subject", _chunk(RANK_N1), "shoal.ev.task.t1.chunk_generated.n0", "claiming node 'n1'"),
    ("another task's subject", _chunk(RANK_N1), "shoal.ev.task.t2.chunk_generated.n1", "its subject is"),
    ("another kind's subject", _chunk(RANK_N1), "shoal.ev.task.t1.completed.n1", "its subject is"),
    # The two frequent kinds are checked by a shortcut (`route_refusal`'s first branch): its edges
    ("no node claimed, a node's subject", _chunk(NO_NODE), "shoal.ev.task.t1.chunk_generated.n1", "its subject is"),
    ("no node claimed, an empty node token", _chunk(NO_NODE), "shoal.ev.task.t1.chunk_generated.", "its subject is"),
    ("no node claimed, its own subject", _chunk(NO_NODE), "shoal.ev.task.t1.chunk_generated", None),
    ("a progress report on its own subject", _progress(RANK_N1), "shoal.ev.task.t1.prefill_progress.n1", None),
    (
        "a progress report on another node's",
        _progress(RANK_N1),
        "shoal.ev.task.t1.prefill_progress.n0",
        "claiming node 'n1'",
    ),
    (
        "a progress report on a chunk's subject",
        _progress(RANK_N1),
        "shoal.ev.task.t1.chunk_generated.n1",
        "its subject",
    ),
    (
        "a master's event on a node's subject",
        TaskFailed(env=Stamper(MASTER).stamp(), task_id=T1, error="x"),
        "shoal.ev.task.t1.failed.n0",
        "claiming the 'master'",
    ),
    (
        "a node's heartbeat for another node",
        NodeHeartbeat(env=Stamper(WORKER_N1).stamp(), node_id=NodeId("n2")),
        "shoal.hb.node.n1",
        "its subject is 'shoal.hb.node.n2'",
    ),
]


@pytest.mark.parametrize(("event", "subject", "refused"), [r[1:] for r in ROUTES], ids=[r[0] for r in ROUTES])
def test_an_event_is_taken_only_from_its_own_subject(event: AnyEvent, subject: str, refused: str | None) -> None:
    for given_as in (subject, subject.encode()):  # as the wire reader hands it: bytes
        refusal = route_refusal(given_as, event)
        if refused is None:
            assert refusal is None
        else:
            assert refusal is not None and refused in refusal, refusal


@settings(max_examples=100, deadline=None)
@given(event_strategy())
def test_every_event_is_taken_from_the_subject_it_is_published_on(event: AnyEvent) -> None:
    assert route_refusal(subject_for(event), event) is None


def test_a_completion_on_the_subject_of_the_node_that_published_it() -> None:
    completed = TaskCompleted(env=Stamper(RANK_N1).stamp(), task_id=T1, finish_reason="stop")
    assert route_refusal("shoal.ev.task.t1.completed.n1", completed) is None
    assert route_refusal("shoal.ev.task.t1.completed.n2", completed) is not None
