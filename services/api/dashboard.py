"""What the dashboard shows, as a pure function of the State: a small summary, and its deltas.

The page gets `snapshot(state)` once, then, for every event folded, `deltas(before, after, event)`:
the rows the event changed, each sent whole (an upsert keyed by its id). Nothing is ever removed
from the State, so nothing is ever removed from the page either, except ended tasks past the
newest `RECENT_ENDED`, which the page trims by the same rule.

Invariant (tested by folding random logs): merging `deltas` into `snapshot(before)` gives
`snapshot(after)`, keeping every ended task; so a page that got the snapshot and every delta
since shows what a fresh snapshot would.

The rows carry ids, statuses, counts and diagnoses, never prompt or output text: the page is an
operator's view of the cluster, not a transcript.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import msgspec

from events.catalogue import LogEvent
from events.ids import InstanceId, NodeId, TaskId
from events.state import InstanceInfo, NodeInfo, State, TaskInfo

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")
RECENT_ENDED = 50  # ended tasks shown, newest first: enough to see what just happened


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    node_id: NodeId
    host: str
    cores: int
    memory_bytes: int
    backend: str
    status: str
    reason: str


class ShardRow(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    node_id: NodeId
    start_layer: int
    end_layer: int
    status: str  # the rank's runner status ("placed" before it reported one)


class InstanceRow(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: InstanceId
    model: str
    ready: bool
    failed: bool
    retired: bool
    shards: tuple[ShardRow, ...]
    queue: tuple[TaskId, ...]


class RankRow(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    processed: int  # prompt tokens this rank has prefilled
    total: int
    iteration: int


class TaskRow(msgspec.Struct, frozen=True, kw_only=True):
    task_id: TaskId
    model: str
    status: str
    instance_id: InstanceId | None
    created_at: int  # wall ns
    ranks: tuple[RankRow, ...]  # prefill progress, by rank
    completion_tokens: int
    stalled: str  # the master's stall diagnosis, "" when none
    error: str
    finish_reason: str | None
    ended_seq: int  # 0 while running


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    last_seq: int
    nodes: tuple[NodeRow, ...]
    instances: tuple[InstanceRow, ...]
    tasks: tuple[TaskRow, ...]  # running tasks, then the newest ended ones


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """The rows one folded event changed (a row is sent whole; the page replaces it by id)."""

    seq: int
    nodes: tuple[NodeRow, ...] = ()
    instances: tuple[InstanceRow, ...] = ()
    tasks: tuple[TaskRow, ...] = ()


def node_row(node: NodeInfo) -> NodeRow:
    """The node's fields the page shows (`NodeRow` names a subset of `NodeInfo`'s)."""
    return msgspec.convert(msgspec.structs.asdict(node), NodeRow)


def instance_row(instance: InstanceInfo) -> InstanceRow:
    runners = {runner.rank: runner.status for runner in instance.runners}
    shards = tuple(
        ShardRow(
            rank=shard.rank,
            node_id=shard.node_id,
            start_layer=shard.start_layer,
            end_layer=shard.end_layer,
            status=runners.get(shard.rank, "placed"),
        )
        for shard in instance.shards
    )
    return InstanceRow(
        instance_id=instance.instance_id,
        model=instance.model,
        ready=instance.ready,
        failed=instance.failed,
        retired=instance.retired,
        shards=shards,
        queue=instance.queue,
    )


def task_row(task: TaskInfo) -> TaskRow:
    """The task's prefill progress per rank: the newest progress report, else what its prefill
    started with (0 of the prompt), so a rank appears as soon as it starts."""
    ranks = {
        rank: RankRow(rank=rank, processed=0, total=p.prompt_tokens, iteration=0) for rank, p in task.prefill.items()
    }
    for rank, progress in task.progress.items():
        ranks[rank] = RankRow(
            rank=rank, processed=progress.processed, total=progress.total, iteration=progress.iteration
        )
    return TaskRow(
        task_id=task.task_id,
        model=task.model,
        status=task.status,
        instance_id=task.instance_id,
        created_at=task.created_at,
        ranks=tuple(ranks[rank] for rank in sorted(ranks)),
        completion_tokens=task.completion_tokens,
        stalled=task.stalled,
        error=task.error,
        finish_reason=task.finish_reason,
        ended_seq=task.ended_seq,
    )


def snapshot(state: State, recent_ended: int | None = RECENT_ENDED) -> Summary:
    """The summary of `state`: every node and instance, the running tasks and the newest
    `recent_ended` ended ones (all of them with None)."""
    running = sorted((t for t in state.tasks.values() if not t.ended), key=lambda t: t.created_seq)
    ended = sorted((t for t in state.tasks.values() if t.ended), key=lambda t: t.ended_seq, reverse=True)
    shown = running + (ended if recent_ended is None else ended[:recent_ended])
    return Summary(
        last_seq=state.last_seq,
        nodes=tuple(node_row(state.nodes[key]) for key in sorted(state.nodes.keys())),
        instances=tuple(instance_row(state.instances[key]) for key in sorted(state.instances.keys())),
        tasks=tuple(task_row(task) for task in shown),
    )


def deltas(before: State, after: State, event: LogEvent) -> Delta | None:
    """The rows `event` changed between `before` and `after`, or None if it changed none shown.

    An event names what it is about (a node, an instance, a task); a task's event may also move
    its instance's queue, so that instance is looked at too."""
    node_id: NodeId | None = getattr(event, "node_id", None)
    task_id: TaskId | None = getattr(event, "task_id", None)
    instance_ids = {getattr(event, "instance_id", None)}
    if task_id is not None:
        instance_ids |= {t.instance_id for t in (before.tasks.get(task_id), after.tasks.get(task_id)) if t}
    nodes = _changed(before.nodes, after.nodes, node_id, node_row)
    instances = tuple(row for i in instance_ids for row in _changed(before.instances, after.instances, i, instance_row))
    tasks = _changed(before.tasks, after.tasks, task_id, task_row)
    if not (nodes or instances or tasks):
        return None
    return Delta(seq=after.last_seq, nodes=nodes, instances=instances, tasks=tasks)


def _changed(before: Mapping[K, V], after: Mapping[K, V], key: K | None, row: Callable[[V], R]) -> tuple[R, ...]:
    if key is None or key not in after:
        return ()
    new = row(after[key])
    return () if key in before and row(before[key]) == new else (new,)
