"""apply(state, seq, event) -> State: the pure fold over SHOAL_EVENTS (docs/ARCHITECTURE.md §4).

One small function per event kind, dispatched by an exhaustive `match`; the most frequent kinds
(progress, chunks) are matched first. Errors are named:
- `SequenceGap`: the caller skipped or repeated a sequence number (the caller's bug: fatal);
- a `PoisonEvent`, an event the log holds but the fold refuses, which `events.fold` quarantines
  (records in the State and skips) so that it never stops a service:
  - `UnknownTask` / `UnknownInstance` / `UnknownNode`: an event about an id never introduced
    (forged, or dangling once retention trimmed the event that introduced it);
  - `InvalidEvent`: an event that contradicts the State (a rank outside the instance);
  - `ForbiddenOrigin`: an event its origin cannot have published (`events.origins`);
  - `Misrouted`: an event whose claimed origin (or content) disagrees with the subject it arrived
    on, the one thing about it the server checked (`events.subjects.route_refusal`; the fold
    checks it when the reader hands it the subject, `events.fold`).
Late events about an ended task (a slow rank's progress after the watchdog failed the task, a
second terminal event) are legitimate races: they advance `last_seq` and change nothing else; so
are those about an ended task whose payload has since left the State (`events.retention`).
"""

from __future__ import annotations

from typing import assert_never

import msgspec

from events.apply_models import (
    model_download_progress,
    model_load_requested,
    model_unavailable,
    model_unload_requested,
)
from events.apply_nodes import link_measured, node_joined
from events.catalogue import (
    ChunkGenerated,
    ClusterStarted,
    InstancePlaced,
    InstanceRetired,
    LinkMeasured,
    LogEvent,
    ModelDownloadProgress,
    ModelLoadRequested,
    ModelUnavailable,
    ModelUnloadRequested,
    NodeJoined,
    NodeLeft,
    NodeTimedOut,
    PrefillProgress,
    PrefillStarted,
    RunnerStatusChanged,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
    tag_of,
)
from events.ids import InstanceId, NodeId, TaskId
from events.origins import origin_refusal
from events.retention import is_evicted, late_about_evicted, task_ended, task_started
from events.state import InstanceInfo, RankPrefill, RankProgress, RunnerInfo, State, TaskInfo

replace = msgspec.structs.replace


class ApplyError(Exception):
    """An event that cannot be folded into the State."""


class SequenceGap(ApplyError):
    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"sequence gap: expected seq {expected}, got {got}")
        self.expected = expected
        self.got = got


class PoisonEvent(ApplyError):
    """An event the fold refuses: quarantined (`events.fold.quarantine`), never applied."""


class UnknownTask(PoisonEvent):
    def __init__(self, task_id: str, kind: str) -> None:
        super().__init__(f"{kind} refers to unknown task {task_id!r}")
        self.task_id = task_id


class UnknownInstance(PoisonEvent):
    def __init__(self, instance_id: str, kind: str) -> None:
        super().__init__(f"{kind} refers to unknown instance {instance_id!r}")
        self.instance_id = instance_id


class UnknownNode(PoisonEvent):
    def __init__(self, node_id: str, kind: str) -> None:
        super().__init__(f"{kind} refers to unknown node {node_id!r}")
        self.node_id = node_id


class InvalidEvent(PoisonEvent):
    """An event that contradicts the State."""


class ForbiddenOrigin(PoisonEvent):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind} refused: {reason}")
        self.reason = reason


class Misrouted(PoisonEvent):
    def __init__(self, reason: str) -> None:
        super().__init__(f"misrouted: {reason}")
        self.reason = reason


# One case per event kind of the union (assert_never proves it whole): the branches are the list of
# kinds, each handled by its own rule, so the complexity check counts the union, not tangled logic.
def apply(state: State, seq: int, event: LogEvent) -> State:  # noqa: C901
    if seq != state.last_seq + 1:
        raise SequenceGap(state.last_seq + 1, seq)
    refusal = origin_refusal(state, event)
    if refusal is not None:
        raise ForbiddenOrigin(tag_of(event), refusal)
    if late_about_evicted(state, event):  # a race with the task's end, as for a task still held
        return _advance(state, seq)
    match event:
        case PrefillProgress():
            return _prefill_progress(state, seq, event)
        case ChunkGenerated():
            return _chunk_generated(state, seq, event)
        case PrefillStarted():
            return _prefill_started(state, seq, event)
        case TaskCreated():
            return _task_created(state, seq, event)
        case TaskAssigned():
            return _task_assigned(state, seq, event)
        case TaskCancelled():
            return _task_cancelled(state, seq, event)
        case TaskCompleted():
            return _task_completed(state, seq, event)
        case TaskFailed():
            return _task_failed(state, seq, event)
        case TaskStalled():
            return _task_stalled(state, seq, event)
        case NodeJoined():
            return node_joined(state, seq, event)
        case LinkMeasured():
            return link_measured(state, seq, event)
        case NodeLeft():
            return _node_gone(state, seq, event.node_id, "left", event.reason, event.env.wall_time, "node_left")
        case NodeTimedOut():
            reason = f"no heartbeat since {event.last_seen}"
            return _node_gone(state, seq, event.node_id, "timed_out", reason, event.env.wall_time, "node_timed_out")
        case InstancePlaced():
            return _instance_placed(state, seq, event)
        case RunnerStatusChanged():
            return _runner_status_changed(state, seq, event)
        case InstanceRetired():
            return _instance_retired(state, seq, event)
        case ModelDownloadProgress():
            return model_download_progress(state, seq, event)
        case ModelUnavailable():
            return model_unavailable(state, seq, event)
        case ModelLoadRequested():
            return model_load_requested(state, seq, event)
        case ModelUnloadRequested():
            return model_unload_requested(state, seq, event)
        case ClusterStarted():  # marks a run for the operator tools; the State carries over
            return _advance(state, seq)
        case _:
            assert_never(event)


# --- helpers ---------------------------------------------------------------------------------


def _task(state: State, task_id: TaskId, kind: str) -> TaskInfo:
    task = state.tasks.get(task_id)
    if task is None:
        raise UnknownTask(task_id, kind)
    return task


def _instance(state: State, instance_id: InstanceId, kind: str) -> InstanceInfo:
    instance = state.instances.get(instance_id)
    if instance is None:
        raise UnknownInstance(instance_id, kind)
    return instance


def _with_task(state: State, seq: int, task: TaskInfo) -> State:
    return replace(state, last_seq=seq, tasks=state.tasks.set(task.task_id, task))


def _advance(state: State, seq: int) -> State:
    return replace(state, last_seq=seq)


def _dequeue(state: State, task: TaskInfo, at: int, seq: int) -> State:
    if task.instance_id is None:
        return state
    instance = state.instances.get(task.instance_id)
    if instance is None or task.task_id not in instance.queue:
        return state
    queue = tuple(t for t in instance.queue if t != task.task_id)
    head_since = at if instance.queue[0] == task.task_id else instance.head_since
    updated = replace(instance, queue=queue, head_since=head_since, last_busy_seq=seq)
    return replace(state, instances=state.instances.set(instance.instance_id, updated))


def _end_task(state: State, seq: int, task: TaskInfo, at: int) -> State:
    ended = replace(task, ended_at=at, ended_seq=seq, last_activity_at=at)
    return task_ended(_dequeue(_with_task(state, seq, ended), ended, at, seq), ended.task_id)


# --- task lifecycle --------------------------------------------------------------------------


# The two hot paths: most of a log is progress and chunks. `events.fold.Folder` applies the same
# two updates to a transient map, so they are shared functions of (task, event).


def progress_update(task: TaskInfo, event: PrefillProgress) -> TaskInfo:
    at = event.env.wall_time
    position = RankProgress(processed=event.processed, total=event.total, iteration=event.iteration, at=at)
    return replace(task, progress={**task.progress, event.rank: position}, last_activity_at=at)


def chunk_update(task: TaskInfo, event: ChunkGenerated) -> TaskInfo:
    """Tokens count every choice's (`TaskParams.n`); the text is choice 0's: the others' would
    interleave with it, chunk by chunk."""
    at = event.env.wall_time
    return replace(
        task,
        status="decoding",
        first_token_at=task.first_token_at or at,
        completion_tokens=task.completion_tokens + len(event.token_ids),
        chunks=task.chunks + 1,
        text=task.text + event.text if event.choice == 0 else task.text,
        last_activity_at=at,
    )


def _prefill_progress(state: State, seq: int, event: PrefillProgress) -> State:
    task = state.tasks.get(event.task_id)
    if task is None:
        raise UnknownTask(event.task_id, "prefill_progress")
    if task.ended_seq:  # a late report after the task ended changes nothing
        return replace(state, last_seq=seq)
    return replace(state, last_seq=seq, tasks=state.tasks.set(event.task_id, progress_update(task, event)))


def _chunk_generated(state: State, seq: int, event: ChunkGenerated) -> State:
    task = state.tasks.get(event.task_id)
    if task is None:
        raise UnknownTask(event.task_id, "chunk_generated")
    if task.ended_seq:
        return replace(state, last_seq=seq)
    return replace(state, last_seq=seq, tasks=state.tasks.set(event.task_id, chunk_update(task, event)))


def _prefill_started(state: State, seq: int, event: PrefillStarted) -> State:
    task = _task(state, event.task_id, "prefill_started")
    if task.ended:
        return _advance(state, seq)
    at = event.env.wall_time
    started = RankPrefill(
        path=event.path, prompt_tokens=event.prompt_tokens, chunks=event.chunks, step=event.step, started_at=at
    )
    prefill = dict(task.prefill)
    prefill[event.rank] = started
    status = "prefilling" if task.status in ("created", "assigned") else task.status
    return _with_task(state, seq, replace(task, prefill=prefill, status=status, last_activity_at=at))


def _task_created(state: State, seq: int, event: TaskCreated) -> State:
    if event.task_id in state.tasks or is_evicted(state, event.task_id):
        raise InvalidEvent(f"task {event.task_id!r} was already created")
    at = event.env.wall_time
    task = TaskInfo(
        task_id=event.task_id,
        model=event.model,
        messages=event.messages,
        params=event.params,
        owner=event.owner,
        created_seq=seq,
        created_at=at,
        last_activity_at=at,
    )
    return task_started(_with_task(state, seq, task), task)


def _task_assigned(state: State, seq: int, event: TaskAssigned) -> State:
    task = _task(state, event.task_id, "task_assigned")
    instance = _instance(state, event.instance_id, "task_assigned")
    if task.ended:
        return _advance(state, seq)
    if task.instance_id is not None:
        raise InvalidEvent(f"task {task.task_id!r} is already assigned to {task.instance_id!r}")
    at = event.env.wall_time
    assigned = replace(
        task, status="assigned", instance_id=instance.instance_id, assigned_at=at, assigned_seq=seq, last_activity_at=at
    )
    head_since = instance.head_since if instance.queue else at
    keep_alive = task.params.keep_alive_seconds
    queued = replace(
        instance,
        queue=(*instance.queue, task.task_id),
        head_since=head_since,
        last_busy_seq=seq,
        last_assigned_seq=seq,
        keep_alive_seconds=instance.keep_alive_seconds if keep_alive is None else keep_alive,
    )
    return replace(
        state,
        last_seq=seq,
        tasks=state.tasks.set(task.task_id, assigned),
        instances=state.instances.set(instance.instance_id, queued),
    )


def _task_cancelled(state: State, seq: int, event: TaskCancelled) -> State:
    task = _task(state, event.task_id, "task_cancelled")
    if task.ended or task.cancel_reason is not None:
        return _advance(state, seq)
    at = event.env.wall_time
    return _with_task(state, seq, replace(task, cancel_reason=event.reason, cancelled_at=at, last_activity_at=at))


def _task_completed(state: State, seq: int, event: TaskCompleted) -> State:
    task = _task(state, event.task_id, "task_completed")
    if task.ended:
        return _advance(state, seq)
    status = "cancelled" if event.finish_reason == "cancelled" else "completed"
    done = replace(task, status=status, finish_reason=event.finish_reason, usage=event.usage)
    return _end_task(state, seq, done, event.env.wall_time)


def _task_failed(state: State, seq: int, event: TaskFailed) -> State:
    task = _task(state, event.task_id, "task_failed")
    if task.ended:
        return _advance(state, seq)
    failed = replace(task, status="failed", error=event.error, failed_rank=event.rank)
    return _end_task(state, seq, failed, event.env.wall_time)


def _task_stalled(state: State, seq: int, event: TaskStalled) -> State:
    task = _task(state, event.task_id, "task_stalled")
    if task.ended:
        return _advance(state, seq)
    return _with_task(state, seq, replace(task, stalled=event.diagnosis))


# --- cluster ---------------------------------------------------------------------------------


def _node_gone(state: State, seq: int, node_id: NodeId, status: str, reason: str, at: int, kind: str) -> State:
    node = state.nodes.get(node_id)
    if node is None:
        raise UnknownNode(node_id, kind)
    gone = replace(node, status=status, reason=reason, changed_at=at, changed_seq=seq)
    return replace(state, last_seq=seq, nodes=state.nodes.set(node_id, gone))


def _instance_placed(state: State, seq: int, event: InstancePlaced) -> State:
    if event.instance_id in state.instances:
        raise InvalidEvent(f"instance {event.instance_id!r} was already placed")
    ranks = sorted(shard.rank for shard in event.shards)
    if ranks != list(range(len(event.shards))) or len(event.ring_hosts) != len(event.shards):
        raise InvalidEvent(
            f"instance {event.instance_id!r}: shards must have ranks 0..{len(event.shards) - 1} "
            f"and one ring host each, got ranks {ranks} and {len(event.ring_hosts)} hosts"
        )
    for shard in event.shards:
        if shard.node_id not in state.nodes:
            raise UnknownNode(shard.node_id, "instance_placed")
    shards = tuple(sorted(event.shards, key=lambda s: s.rank))
    at = event.env.wall_time
    instance = InstanceInfo(
        instance_id=event.instance_id,
        model=event.model,
        shards=shards,
        ring_hosts=tuple(event.ring_hosts),
        settings=event.settings,
        runners=tuple(RunnerInfo(rank=s.rank, node_id=s.node_id, changed_at=at, changed_seq=seq) for s in shards),
        placed_seq=seq,
        placed_at=at,
        placement_reason=event.reason,
        replaces=event.replaces,
    )
    return replace(state, last_seq=seq, instances=state.instances.set(instance.instance_id, instance))


def _runner_status_changed(state: State, seq: int, event: RunnerStatusChanged) -> State:
    instance = _instance(state, event.instance_id, "runner_status_changed")
    if not 0 <= event.rank < len(instance.runners):
        raise InvalidEvent(
            f"runner_status_changed: rank {event.rank} outside instance {instance.instance_id!r} "
            f"of {len(instance.runners)} ranks"
        )
    runner = replace(
        instance.runners[event.rank],
        status=event.status,
        detail=event.detail,
        cause=event.cause,
        changed_at=event.env.wall_time,
        changed_seq=seq,
    )
    runners = (*instance.runners[: event.rank], runner, *instance.runners[event.rank + 1 :])
    updated = replace(instance, runners=runners)
    if updated.ready and not updated.became_ready_at:
        updated = replace(updated, became_ready_at=event.env.wall_time)
    return replace(state, last_seq=seq, instances=state.instances.set(instance.instance_id, updated))


def _instance_retired(state: State, seq: int, event: InstanceRetired) -> State:
    instance = _instance(state, event.instance_id, "instance_retired")
    retired = replace(
        instance,
        retired=True,
        retire_reason=event.reason,
        retire_cause=event.cause,
        retired_at=event.env.wall_time,
        retired_seq=seq,
    )
    return replace(state, last_seq=seq, instances=state.instances.set(instance.instance_id, retired))
