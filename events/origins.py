"""Who may publish what: the origin rule of each event kind (docs/ARCHITECTURE.md §2, "published by").

Defence in depth behind the bus's own permissions: an event whose `env.origin` cannot have
produced it is refused by the fold (`apply` raises `ForbiddenOrigin`, and the event is
quarantined), so a forged `ChunkGenerated` or `InstancePlaced` never changes the State.

The rules, read off every publisher (grep `Origin(`):
- the API creates and cancels tasks;
- the master places, assigns, retires, times nodes out, declares stalls, and ends tasks no rank
  will end (`TaskCompleted` of a task cancelled while waiting, `TaskFailed` of one nobody serves);
- a worker announces only its own node (an operator revoking a node says it left: its worker is
  cut off the bus and cannot), and reports the exit of a runner it ran (a rank of an
  instance placed on its node);
- a runner (`service=runner`, its node and rank) reports its own rank's status, the progress of
  tasks assigned to its instance, and its node's model downloads; the chunks and the completion of
  such a task come only from the rank that samples (the last: no other rank has a token to
  report), its failure from any of its ranks (a rank that breaks says why; one that would lie
  could fail the task anyway, by leaving its collectives);
- the master says a model cannot be served (`ModelUnavailable`);
- `shoal up` says a run began (`ClusterStarted`).

Each rule is a pure function of the State before the event; it answers the reason an origin is
refused, or None. An event about an id the State does not know is left to `apply`, which names
it (`UnknownTask`...) more precisely than an origin rule could.

The origin checked here is the one the event claims; what binds it to the publisher's identity
is the subject (`events.subjects.route_refusal`): the server lets `runner-<node>` publish only
subjects ending in its node, and the fold refuses an event whose origin names another node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import assert_never

from events.catalogue import (
    AnyEvent,
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
    Origin,
    PrefillProgress,
    PrefillStarted,
    RunnerHeartbeat,
    RunnerStatusChanged,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
)
from events.ids import InstanceId
from events.state import InstanceInfo, State, TaskInfo
from events.subjects import route_refusal

API = "api"
MASTER = "master"
WORKER = "worker"
RUNNER = "runner"
UP = "up"  # `shoal up`, as the admin identity that starts a run
OPERATOR = "operator"  # an operator's command run as the admin identity (`shoal nats revoke-node`)


def origin_refusal(state: State, event: LogEvent) -> str | None:
    """Why `event.env.origin` may not publish `event` given `state`; None when it may."""
    origin = event.env.origin
    match event:
        case PrefillProgress() | PrefillStarted():
            task = state.tasks.get(event.task_id)
            return None if task is None else task_runner_refusal(state.instances, task, origin, event.rank)
        case ChunkGenerated():
            task = state.tasks.get(event.task_id)
            return None if task is None else task_runner_refusal(state.instances, task, origin, None, sampling=True)
        case TaskCreated() | TaskCancelled() | ModelLoadRequested() | ModelUnloadRequested():
            return _service_refusal(origin, API)
        case ClusterStarted():
            return _service_refusal(origin, UP)
        case (
            TaskAssigned() | TaskStalled() | InstancePlaced() | InstanceRetired() | NodeTimedOut() | ModelUnavailable()
        ):
            return _service_refusal(origin, MASTER)
        case ModelDownloadProgress():
            if origin.service == RUNNER and origin.node == event.node_id:
                return None
            return f"only a runner on node {event.node_id!r} reports its downloads, not {_who(origin)}"
        case TaskCompleted() | TaskFailed():
            task = state.tasks.get(event.task_id)
            if origin.service == MASTER or task is None:
                return None
            sampling = isinstance(event, TaskCompleted)
            return task_runner_refusal(state.instances, task, origin, None, sampling=sampling)
        case NodeLeft() if origin.service == OPERATOR:
            return None  # a node revoked: its worker, cut off the bus, cannot say so itself
        case NodeJoined() | NodeLeft() | LinkMeasured():
            if origin.service == WORKER and origin.node == event.node_id:
                return None
            return f"only the worker of node {event.node_id!r} announces it, not {_who(origin)}"
        case RunnerStatusChanged():
            instance = state.instances.get(event.instance_id)
            return None if instance is None else _rank_refusal(instance, origin, event.rank)
        case _:
            assert_never(event)


def heartbeat_refusal(state: State, beat: AnyEvent, subject: str | bytes) -> str | None:
    """Why a heartbeat read from `subject` is not to be believed; None when it is. Heartbeats are
    not folded, but the master times nodes out and judges ranks by them, so they are held to the
    same rule: the subject the server checked (a node's beat names it; a rank's beat ends with
    its node), and a rank's beat from a runner on the node that rank runs on."""
    refusal = route_refusal(subject, beat)
    if refusal is not None or not isinstance(beat, RunnerHeartbeat):
        return refusal
    origin = beat.env.origin
    instance = state.instances.get(beat.instance_id)
    if instance is None or not origin.node:  # not placed yet as this reader knows; or an older log's beat
        return None
    if origin.service != RUNNER or origin.rank != beat.rank:
        return f"{_who(origin)} beats for rank {beat.rank} of {beat.instance_id!r}"
    return _runner_of(instance, origin)


def task_runner_refusal(
    instances: Mapping[InstanceId, InstanceInfo],
    task: TaskInfo,
    origin: Origin,
    rank: int | None,
    *,
    sampling: bool = False,
) -> str | None:
    """A runner of the instance `task` is assigned to, reporting as itself (`rank`: the rank the
    event claims, when it claims one); with `sampling`, the instance's last rank, the only one
    that has tokens to report. Shared with `events.fold.Folder`'s hot path."""
    if origin.service != RUNNER:
        return f"only a runner of the task's instance reports on task {task.task_id!r}, not {_who(origin)}"
    instance_id = task.instance_id
    instance = instances.get(instance_id) if instance_id is not None else None
    if instance is None:
        return f"task {task.task_id!r} is assigned to no instance, so no runner reports on it"
    claimed = origin.rank
    if rank is not None and rank != claimed:
        return f"{_who(origin)} reports for rank {rank}"
    runners = instance.runners
    last = len(runners) - 1
    if sampling and claimed != last:
        return f"only the sampling rank ({last}) of {instance.instance_id!r} reports tokens and ends tasks, not {_who(origin)}"
    # `_runner_of`, inline: this runs for nearly every event of a log
    if claimed is None or not 0 <= claimed <= last or runners[claimed].node_id != origin.node:
        return _not_a_rank(instance, origin)
    return None


def _rank_refusal(instance: InstanceInfo, origin: Origin, rank: int) -> str | None:
    """The status of `rank`: from that rank's runner, or from the worker of the node it runs on."""
    if not 0 <= rank < len(instance.runners):
        return None  # apply names a rank outside the instance
    node = instance.runners[rank].node_id
    if origin.service == WORKER and origin.node == node:
        return None
    if origin.service == RUNNER and origin.rank == rank:
        return _runner_of(instance, origin)
    return f"only rank {rank} of {instance.instance_id!r} or the worker of node {node!r} reports it, not {_who(origin)}"


def _runner_of(instance: InstanceInfo, origin: Origin) -> str | None:
    rank = origin.rank
    if rank is None or not 0 <= rank < len(instance.runners) or instance.runners[rank].node_id != origin.node:
        return _not_a_rank(instance, origin)
    return None


def _not_a_rank(instance: InstanceInfo, origin: Origin) -> str:
    return f"{_who(origin)} is not a rank of instance {instance.instance_id!r}"


def _service_refusal(origin: Origin, service: str) -> str | None:
    return None if origin.service == service else f"only the {service} publishes it, not {_who(origin)}"


def _who(origin: Origin) -> str:
    where = f" on node {origin.node!r}" if origin.node else ""
    rank = f" rank {origin.rank}" if origin.rank is not None else ""
    return f"{origin.service!r}{rank}{where}"
