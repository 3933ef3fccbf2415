"""What the dashboard shows, as a pure function of the State: a small summary, and its deltas.

The page gets `snapshot(state, configured)` once, then, for every event folded,
`deltas(before, after, event, configured)`: the rows the event changed, each sent whole (an upsert
keyed by its id), and the models no longer shown. Nothing else is ever removed from the State, so
nothing else is removed from the page either, except ended tasks past the newest `RECENT_ENDED`,
which the page trims by the same rule.

Invariant (tested by folding random logs): merging `deltas` into `snapshot(before)` gives
`snapshot(after)`, keeping every ended task; so a page that got the snapshot and every delta
since shows what a fresh snapshot would.

What each row derives from, so that `deltas` looks only where an event can have changed something
(a chunk, most of a log, costs one task row and nothing else):
- a node's memory (budget, reserved by live instances, its host's) changes only with cluster
  events (nodes joining or going, instances placed or retired), never with a task's event;
- an instance's running batch and queue change only when one of its tasks changes instance or
  status; its state (loading, ready, draining, failed, retired) with its own events and its
  model's (an operator's unload drains it);
- a model's waiting tasks change only when a task changes status, instance or is cancelled.

The rows carry ids, statuses, counts and diagnoses, never prompt or output text: the page is an
operator's view of the cluster, not a transcript. Tokens per second are not rows of the State:
see `services.api.dashboard_rates`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from events.catalogue import LogEvent
from events.ids import InstanceId, NodeId, TaskId
from events.retention import live_tasks_of
from events.state import InstanceInfo, NodeInfo, State, TaskInfo
from services.api.model_cards import model_state
from services.api.responses import ModelState
from services.master.capacity import Rooms, rooms
from services.master.lifecycle import draining, pinned
from services.models import model_error

RECENT_ENDED = 50  # ended tasks shown, newest first: enough to see what just happened
IN_BATCH: frozenset[str] = frozenset({"prefilling", "decoding"})  # statuses of a task its instance runs

InstanceState = Literal["loading", "ready", "draining", "failed", "retired"]


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    node_id: NodeId
    host: str
    cores: int
    memory_bytes: int  # what shoal may place on the node (its budget)
    reserved_bytes: int  # what the live instances placed on it reserve (0 while it is down)
    host_memory_bytes: int  # the machine's memory, shared with every node on `host`
    host_reserved_bytes: int  # what live instances reserve on all of the host's nodes that are up
    backend: str
    status: str
    reason: str


class ShardRow(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    node_id: NodeId
    start_layer: int
    end_layer: int
    memory_bytes: int  # what placement reserved for this rank on its node
    status: str  # the rank's runner status ("placed" before it reported one)


class InstanceRow(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: InstanceId
    model: str
    state: InstanceState
    placement_reason: str  # why the master put it there (`shoal placement explain`)
    retire_reason: str
    shards: tuple[ShardRow, ...]
    running: tuple[TaskId, ...]  # in its batch: prefilling or decoding, in assignment order
    queued: tuple[TaskId, ...]  # assigned to it, not started yet


class DownloadRow(msgspec.Struct, frozen=True, kw_only=True):
    node_id: NodeId
    bytes_done: int
    bytes_total: int  # 0 = not known yet


class ModelRow(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    state: ModelState  # as `/v1/models` says it (`services.api.model_cards.model_state`)
    pinned: bool
    waiting: tuple[TaskId, ...]  # tasks waiting at the master for an instance, oldest first
    error: str  # why it is not served ("" when it is, or may be)
    downloads: tuple[DownloadRow, ...]  # unfinished downloads, by node


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
    models: tuple[ModelRow, ...]
    instances: tuple[InstanceRow, ...]
    tasks: tuple[TaskRow, ...]  # running tasks, then the newest ended ones


class Delta(msgspec.Struct, frozen=True, kw_only=True):
    """The rows one folded event changed (a row is sent whole; the page replaces it by id), and
    the models it no longer shows (a model only a task named, once that task ended)."""

    seq: int
    nodes: tuple[NodeRow, ...] = ()
    models: tuple[ModelRow, ...] = ()
    instances: tuple[InstanceRow, ...] = ()
    tasks: tuple[TaskRow, ...] = ()
    gone_models: tuple[str, ...] = ()


# --- rows ------------------------------------------------------------------------------------


def node_rows(state: State) -> dict[NodeId, NodeRow]:
    """Every node with its memory as placement counts it (`services.master.capacity.rooms`)."""
    room = rooms(state)
    return {node_id: node_row(node, room) for node_id, node in state.nodes.items()}


def node_row(node: NodeInfo, room: Rooms) -> NodeRow:
    own = room.nodes.get(node.node_id)
    host = room.hosts.get(node.host)
    return NodeRow(
        node_id=node.node_id,
        host=node.host,
        cores=node.cores,
        memory_bytes=node.memory_bytes,
        reserved_bytes=own.reserved if own is not None else 0,
        host_memory_bytes=host.capacity if host is not None else node.host_memory_bytes or node.memory_bytes,
        host_reserved_bytes=host.reserved if host is not None else 0,
        backend=node.backend,
        status=node.status,
        reason=node.reason,
    )


def instance_state(state: State, instance: InstanceInfo) -> InstanceState:
    if instance.retired:
        return "retired"
    if instance.failed:
        return "failed"
    if draining(state, instance):
        return "draining"
    return "ready" if instance.ready else "loading"


def instance_row(state: State, instance: InstanceInfo) -> InstanceRow:
    runners = {runner.rank: runner.status for runner in instance.runners}
    shards = tuple(
        ShardRow(
            rank=shard.rank,
            node_id=shard.node_id,
            start_layer=shard.start_layer,
            end_layer=shard.end_layer,
            memory_bytes=shard.memory_bytes,
            status=runners.get(shard.rank, "placed"),
        )
        for shard in sorted(instance.shards, key=lambda shard: shard.rank)
    )
    running: list[TaskId] = []
    queued: list[TaskId] = []
    for task_id in instance.queue:
        task = state.tasks.get(task_id)
        (running if task is not None and task.status in IN_BATCH else queued).append(task_id)
    return InstanceRow(
        instance_id=instance.instance_id,
        model=instance.model,
        state=instance_state(state, instance),
        placement_reason=instance.placement_reason,
        retire_reason=instance.retire_reason,
        shards=shards,
        running=tuple(running),
        queued=tuple(queued),
    )


def waiting_tasks(state: State) -> dict[str, tuple[TaskId, ...]]:
    """Per model, its tasks that wait for an instance (not assigned, not cancelled), oldest first:
    the same tasks as `services.master.lifecycle.waiting_models` counts."""
    waiting: dict[str, list[TaskId]] = {}
    for task in live_tasks_of(state):
        if task.instance_id is None and task.cancel_reason is None:
            waiting.setdefault(task.model, []).append(task.task_id)
    return {model: tuple(ids) for model, ids in waiting.items()}


def model_row(state: State, model: str, waiting: tuple[TaskId, ...]) -> ModelRow:
    error = model_error(state, model)
    status = state.models.get(model)
    downloads = tuple(
        DownloadRow(node_id=node_id, bytes_done=d.bytes_done, bytes_total=d.bytes_total)
        for node_id, d in sorted(status.downloads.items() if status is not None else [])
        if not d.finished
    )
    return ModelRow(
        model=model,
        state=model_state(state, model, error),
        pinned=pinned(state, model),
        waiting=waiting,
        error=error,
        downloads=downloads,
    )


def shown_models(state: State, configured: Sequence[str]) -> list[str]:
    """The models the page lists: the configured ones, those some event is about (an operator's
    request, a download, a refusal), those with an instance (even retired: it was served), and
    those a running task asks for."""
    named = {*state.models.keys(), *(i.model for i in state.instances.values())}
    named |= {t.model for t in live_tasks_of(state)}
    return list(dict.fromkeys([*configured, *sorted(named)]))


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


# --- the snapshot and its deltas ---------------------------------------------------------------


def snapshot(state: State, configured: Sequence[str] = (), recent_ended: int | None = RECENT_ENDED) -> Summary:
    """The summary of `state`: every node, model and instance, the running tasks and the newest
    `recent_ended` ended ones (all of them with None). `configured`: the models the API serves."""
    running = sorted((t for t in state.tasks.values() if not t.ended), key=lambda t: t.created_seq)
    ended = sorted((t for t in state.tasks.values() if t.ended), key=lambda t: t.ended_seq, reverse=True)
    shown = running + (ended if recent_ended is None else ended[:recent_ended])
    nodes = node_rows(state)
    return Summary(
        last_seq=state.last_seq,
        nodes=tuple(nodes[key] for key in sorted(nodes)),
        models=tuple(_model_rows_of(state, None, configured).values()),
        instances=tuple(instance_row(state, state.instances[key]) for key in sorted(state.instances.keys())),
        tasks=tuple(task_row(task) for task in shown),
    )


def deltas(before: State, after: State, event: LogEvent, configured: Sequence[str] = ()) -> Delta | None:
    """The rows `event` changed between `before` and `after`, or None if it changed none shown."""
    task_id: TaskId | None = getattr(event, "task_id", None)
    delta = (
        _cluster_delta(before, after, event, configured)
        if task_id is None
        else _task_delta(before, after, task_id, configured)
    )
    return delta if delta.nodes or delta.models or delta.instances or delta.tasks or delta.gone_models else None


def _task_delta(before: State, after: State, task_id: TaskId, configured: Sequence[str]) -> Delta:
    """A task's event: its row; its instances' and its model's only when it moved between the
    queue, the batch and the end (or was cancelled), which is all they show of a task."""
    old, new = before.tasks.get(task_id), after.tasks.get(task_id)
    tasks = () if new is None or new is old else (task_row(new),)  # an event that changed the task
    if _place(old) == _place(new):
        return Delta(seq=after.last_seq, tasks=tasks)
    instance_ids = {t.instance_id for t in (old, new) if t is not None and t.instance_id is not None}
    instances = _changed_instances(before, after, instance_ids)
    model_names = {t.model for t in (old, new) if t is not None}
    models, gone = _changed_models(before, after, model_names, configured)
    return Delta(seq=after.last_seq, models=models, instances=instances, tasks=tasks, gone_models=gone)


def _place(task: TaskInfo | None) -> tuple[str, InstanceId | None, bool] | None:
    return None if task is None else (task.status, task.instance_id, task.cancel_reason is not None)


def _cluster_delta(before: State, after: State, event: LogEvent, configured: Sequence[str]) -> Delta:
    """A node's, an instance's or a model's event: any node's memory may have moved, and every
    model's state; the instance it names changed, or every instance of the model it names."""
    old_nodes, new_nodes = node_rows(before), node_rows(after)
    nodes = tuple(row for key, row in sorted(new_nodes.items()) if old_nodes.get(key) != row)
    instance_ids: set[InstanceId] = set()
    named: InstanceId | None = getattr(event, "instance_id", None)
    if named is not None:
        instance_ids.add(named)
    model: str | None = getattr(event, "model", None)
    if model is not None:
        instance_ids |= {i.instance_id for i in after.instances.values() if i.model == model}
    instances = _changed_instances(before, after, instance_ids)
    models, gone = _changed_models(before, after, None, configured)
    return Delta(seq=after.last_seq, nodes=nodes, models=models, instances=instances, gone_models=gone)


def _changed_instances(before: State, after: State, instance_ids: Iterable[InstanceId]) -> tuple[InstanceRow, ...]:
    rows: list[InstanceRow] = []
    for key in sorted(instance_ids):
        instance = after.instances.get(key)
        if instance is None:
            continue
        new = instance_row(after, instance)
        old = before.instances.get(key)
        if old is None or instance_row(before, old) != new:
            rows.append(new)
    return tuple(rows)


def _changed_models(
    before: State, after: State, names: set[str] | None, configured: Sequence[str]
) -> tuple[tuple[ModelRow, ...], tuple[str, ...]]:
    """The rows of `names` (every model with None) that changed, and those no longer shown."""
    old, new = _model_rows_of(before, names, configured), _model_rows_of(after, names, configured)
    return tuple(row for m, row in new.items() if old.get(m) != row), tuple(m for m in old if m not in new)


def _model_rows_of(state: State, names: set[str] | None, configured: Sequence[str]) -> dict[str, ModelRow]:
    waiting = waiting_tasks(state)
    chosen = [m for m in shown_models(state, configured) if names is None or m in names]
    return {model: model_row(state, model, waiting.get(model, ())) for model in chosen}
