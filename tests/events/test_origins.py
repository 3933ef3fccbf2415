"""Who may publish what (events/origins.py), one row per publisher and kind: every publisher the
services really use is accepted, and the forgeries of issues 10 and 43 are refused by the fold."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from events.apply import ForbiddenOrigin, apply
from events.catalogue import (
    ChunkGenerated,
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    NodeJoined,
    NodeLeft,
    NodeTimedOut,
    Origin,
    PrefillProgress,
    PrefillStarted,
    RunnerStatusChanged,
    Shard,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
)
from events.fold import fold
from events.ids import InstanceId, NodeId, TaskId
from events.origins import origin_refusal
from events.stamp import Stamper
from events.state import State
from tests.events.builders import Events

API = Origin(service="api")
MASTER = Origin(service="master")
WORKER_N1 = Origin(service="worker", node="n1")
WORKER_N2 = Origin(service="worker", node="n2")
RANK0 = Origin(service="runner", node="n1", rank=0)  # instance i1: rank 0 on n1, rank 1 on n2
RANK1 = Origin(service="runner", node="n2", rank=1)
RANK1_WRONG_NODE = Origin(service="runner", node="n1", rank=1)
OTHER_INSTANCE_RANK = Origin(service="runner", node="n3", rank=0)  # rank 0 of i2, on n3
NO_RANK = Origin(service="runner", node="n2")


def _state() -> State:
    """Three nodes; i1 on n1+n2 and i2 on n3, both ready; t1 assigned to i1, t2 only created."""
    ev = Events()
    return fold(
        enumerate(
            [
                ev.node("n1"),
                ev.node("n2"),
                ev.node("n3"),
                ev.placed("i1"),
                ev.placed("i2", nodes=("n3",)),
                ev.runner(0, "ready"),
                ev.runner(1, "ready"),
                ev.runner(0, "ready", "i2"),
                ev.created("t1"),
                ev.assigned("t1", "i1"),
                ev.created("t2"),
            ],
            start=1,
        )
    )


T1, T2 = TaskId("t1"), TaskId("t2")
Make = Callable[[Stamper], LogEvent]


def _created(s: Stamper) -> LogEvent:
    return TaskCreated(env=s.stamp(), task_id=TaskId("t9"), model="tiny", messages=[])


def _placed(s: Stamper) -> LogEvent:
    shards = [Shard(node_id=NodeId("n3"), rank=0, start_layer=0, end_layer=8)]
    return InstancePlaced(env=s.stamp(), instance_id=InstanceId("i9"), model="tiny", shards=shards, ring_hosts=["h:1"])


def _status(rank: int) -> Make:
    return lambda s: RunnerStatusChanged(env=s.stamp(), instance_id=InstanceId("i1"), rank=rank, status="failed")


def _progress(rank: int, task: TaskId = T1) -> Make:
    return lambda s: PrefillProgress(env=s.stamp(), task_id=task, rank=rank, processed=1, total=2, iteration=0)


KINDS: dict[str, Make] = {
    "created": _created,
    "cancelled": lambda s: TaskCancelled(env=s.stamp(), task_id=T1, reason="api"),
    "assigned": lambda s: TaskAssigned(env=s.stamp(), task_id=T2, instance_id=InstanceId("i1")),
    "stalled": lambda s: TaskStalled(env=s.stamp(), task_id=T1, diagnosis="x"),
    "placed": _placed,
    "retired": lambda s: InstanceRetired(env=s.stamp(), instance_id=InstanceId("i1"), reason="x"),
    "timed_out": lambda s: NodeTimedOut(env=s.stamp(), node_id=NodeId("n1"), last_seen=0),
    "joined_n1": lambda s: NodeJoined(
        env=s.stamp(), node_id=NodeId("n1"), host="h", cores=1, memory_bytes=1, backend="cpu", version="v"
    ),
    "left_n1": lambda s: NodeLeft(env=s.stamp(), node_id=NodeId("n1"), reason="shutdown"),
    "status_rank1": _status(1),
    "started_rank1": lambda s: PrefillStarted(
        env=s.stamp(), task_id=T1, rank=1, path="pipeline", prompt_tokens=1, chunks=1, step=1
    ),
    "progress_rank1": _progress(1),
    "progress_rank1_unassigned": _progress(1, T2),
    "chunk": lambda s: ChunkGenerated(env=s.stamp(), task_id=T1, index=0, text="x", token_ids=[1]),
    "completed": lambda s: TaskCompleted(env=s.stamp(), task_id=T1, finish_reason="stop"),
    "failed": lambda s: TaskFailed(env=s.stamp(), task_id=T1, error="x"),
}

# kind -> the origins that publish it in the services (grep `Origin(`); every other one is refused.
ALLOWED: dict[str, set[Origin]] = {
    "created": {API},
    "cancelled": {API},
    "assigned": {MASTER},
    "stalled": {MASTER},
    "placed": {MASTER},
    "retired": {MASTER},
    "timed_out": {MASTER},
    "joined_n1": {WORKER_N1},
    "left_n1": {WORKER_N1},
    "status_rank1": {RANK1, WORKER_N2},  # the rank itself, or its worker reporting its exit
    "started_rank1": {RANK1},
    "progress_rank1": {RANK1},
    "progress_rank1_unassigned": set(),  # no runner reports on a task no instance holds
    "chunk": {RANK1},  # the sampling (last) rank only: rank 0 has no token to report
    "completed": {RANK1, MASTER},  # the master ends a task cancelled while waiting
    "failed": {RANK0, RANK1, MASTER},  # any rank that breaks; the master fails a task nobody can serve
}
ORIGINS = (API, MASTER, WORKER_N1, WORKER_N2, RANK0, RANK1, RANK1_WRONG_NODE, OTHER_INSTANCE_RANK, NO_RANK)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("origin", ORIGINS, ids=lambda o: f"{o.service}-{o.node}-{o.rank}")
def test_each_kind_is_accepted_only_from_its_publishers(kind: str, origin: Origin) -> None:
    state = _state()
    event = KINDS[kind](Stamper(origin))
    refusal = origin_refusal(state, event)
    if origin in ALLOWED[kind]:
        assert refusal is None
        apply(state, state.last_seq + 1, event)  # and the fold takes it
    else:
        assert refusal is not None
        with pytest.raises(ForbiddenOrigin, match="refused"):
            apply(state, state.last_seq + 1, event)


def test_an_event_about_an_unknown_id_is_left_to_apply_to_name() -> None:
    ghost = ChunkGenerated(env=Stamper(API).stamp(), task_id=TaskId("ghost"), index=0, text="", token_ids=[])
    assert origin_refusal(_state(), ghost) is None
