"""The master's clock-driven rules: node timeouts and stalled tasks. Pure: `now_ns` is passed in.

Every duration here is measured on one clock, the master's own (its monotonic clock in the
shell), from `Liveness`: when the master first saw each thing. A stamp in the State is another
host's wall clock (the API's `created_at`, a rank's `changed_at`, a worker's download progress);
compared with the master's clock it turns skew into a deadline (an API whose clock runs minutes
slow would have its tasks failed at once, one that runs fast never). The State's stamps are the
fallback only for a caller with no arrivals (a tool replaying a log, where every stamp and `now`
come from the log itself).

A hang never lasts forever: the task at the head of an instance's queue whose ranks report
nothing for `task_stall_seconds` gets a `TaskStalled` naming each rank's last position, then a
`TaskFailed`. A waiting task that no instance serves within `assign_timeout_seconds` fails too,
and so does any task still going `request_timeout_seconds` after it was created (its deadline).
The rank blamed is `events.culprit.name_culprit`'s, from the newest heartbeat of each rank: the
same judgment `shoal diagnose` makes from the log.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from events.catalogue import LogEvent, NodeTimedOut, RunnerHeartbeat, TaskFailed, TaskStalled
from events.culprit import STALLED_TASK_BOUNDS, Culprit, TaskEvidence, name_culprit
from events.ids import InstanceId, NodeId, TaskId
from events.retention import live_tasks_of
from events.stamp import Stamper
from events.state import InstanceInfo, State, TaskInfo
from events.vocabulary import SERVING_STATUSES
from services.master.core import MasterPolicy, judge_instance, retire_instance

NS = 1_000_000_000


RunnerKey = tuple[InstanceId, int]
RankOfTask = tuple[TaskId, int]


class Liveness(msgspec.Struct, frozen=True, kw_only=True):
    """What the master heard, on its own clock (`services.master.hearing`): when it last heard
    each node (wall ns at arrival), each runner's newest heartbeat stamped with its arrival, when
    it first saw each busy instance's head task where it is now (as `activity_silence`, below),
    each failed instance's down ranks as they are now (`losses`), each live task (`tasks`: its request
    deadline and assignment timeout count from here), each loading instance's newest sign of
    loading (`loading`), each rank's prefill position of a stalled-candidate head task
    (`progress`) and each live task's cancel request (`cancels`). Anything missing from these
    is judged by the State's own stamps (a tool replaying a log has no arrivals).
    `node_silence` is each node's silence counted only while the master could see
    (`services.master.sight`); a node missing from it is judged by `now - nodes[node]`.
    `activity_silence` is each busy instance's time without progress since the master first saw
    it where it is now, counted the same way: a master whose reading of the heartbeats stalled (a
    NATS server dying under its consumer) sees no step move, and must not take that for a stalled
    task; an instance missing from it is judged by the State's stamps.
    `wall_offset_ns` turns a time of this clock into the master's wall time, for the one value
    written to the log (`NodeTimedOut.last_seen`)."""

    nodes: Mapping[NodeId, int] = msgspec.field(default_factory=dict[NodeId, int])
    node_silence: Mapping[NodeId, int] = msgspec.field(default_factory=dict[NodeId, int])
    runners: Mapping[RunnerKey, RunnerHeartbeat] = msgspec.field(default_factory=dict[RunnerKey, RunnerHeartbeat])
    activity_silence: Mapping[InstanceId, int] = msgspec.field(default_factory=dict[InstanceId, int])
    losses: Mapping[InstanceId, int] = msgspec.field(default_factory=dict[InstanceId, int])
    tasks: Mapping[TaskId, int] = msgspec.field(default_factory=dict[TaskId, int])
    loading: Mapping[InstanceId, int] = msgspec.field(default_factory=dict[InstanceId, int])
    progress: Mapping[RankOfTask, int] = msgspec.field(default_factory=dict[RankOfTask, int])
    cancels: Mapping[TaskId, int] = msgspec.field(default_factory=dict[TaskId, int])
    wall_offset_ns: int = 0

    def beats_of(self, instance: InstanceInfo) -> dict[int, RunnerHeartbeat]:
        keys = [(instance.instance_id, r.rank) for r in instance.runners]
        return {key[1]: self.runners[key] for key in keys if key in self.runners}


def tick(state: State, now_ns: int, liveness: Liveness, policy: MasterPolicy, stamper: Stamper) -> list[LogEvent]:
    return [
        *_node_timeouts(state, now_ns, liveness, policy, stamper),
        *_stalled_tasks(state, now_ns, liveness, policy, stamper),
        *_overdue_tasks(state, now_ns, liveness, policy, stamper),
        *_orphaned_instances(state, now_ns, liveness, policy, stamper),
        *_loading_deadlines(state, now_ns, liveness, policy, stamper),
    ]


def _loading_deadlines(
    state: State, now_ns: int, liveness: Liveness, policy: MasterPolicy, stamper: Stamper
) -> list[LogEvent]:
    """Instances not ready `instance_ready_timeout_seconds` after their last sign of loading (the
    placement, a rank's status, a download's progress): a rank frozen or wedged while loading.
    Retired, so the model is placed again after its backoff, and the tasks waiting for the model
    fail now with the ranks named rather than wait out the assignment timeout."""
    decisions: list[LogEvent] = []
    limit = policy.instance_ready_timeout_seconds
    for instance in state.instances.values():
        if instance.retired or instance.ready or instance.failed:
            continue
        since = liveness.loading.get(instance.instance_id, loading_since(state, instance))
        if now_ns - since <= limit * NS:
            continue
        loading = still_loading(instance, liveness, now_ns)
        reason = f"not ready within {limit:g}s: {loading}"
        sole = [r.rank for r in instance.runners if r.status not in SERVING_STATUSES]
        rank = sole[0] if len(sole) == 1 else None
        decisions += retire_instance(stamper, instance, reason, "load_deadline", rank=rank)
        error = f"instance {instance.instance_id} of model {instance.model!r} was retired: {reason}"
        for task in live_tasks_of(state):
            if task.model == instance.model and task.instance_id is None:
                env = stamper.stamp(f"master-fail-{task.task_id}")
                decisions.append(TaskFailed(env=env, task_id=task.task_id, error=error))
    return decisions


def loading_since(state: State, instance: InstanceInfo) -> int:
    """Wall ns of the instance's newest sign of loading progress, by the State's stamps."""
    return max(loading_signs(state, instance))


def loading_signs(state: State, instance: InstanceInfo) -> tuple[int, ...]:
    """The stamps of every sign of loading: the placement, each rank's newest status, each of its
    nodes' download progress. Any of them changing is progress, whichever host's clock stamped it."""
    status = state.models.get(instance.model)
    nodes = {s.node_id for s in instance.shards}
    downloads = [d.at for node, d in sorted(status.downloads.items()) if node in nodes] if status is not None else []
    return (instance.placed_at, *(r.changed_at for r in instance.runners), *downloads)


def still_loading(instance: InstanceInfo, liveness: Liveness, now_ns: int) -> str:
    """The ranks not ready yet, each with its status and how long its heartbeats have been silent."""
    beats = liveness.beats_of(instance)
    parts: list[str] = []
    for runner in instance.runners:
        if runner.status in SERVING_STATUSES:
            continue
        beat = beats.get(runner.rank)
        heard = f"last heartbeat {(now_ns - beat.env.wall_time) / NS:.0f}s ago" if beat else "no heartbeat"
        doing = "never reported a status" if runner.status == "placed" else f"still {runner.status}"
        parts.append(f"rank {runner.rank} on {runner.node_id} {doing} ({heard})")
    return "; ".join(parts)


def _orphaned_instances(
    state: State, now_ns: int, liveness: Liveness, policy: MasterPolicy, stamper: Stamper
) -> list[LogEvent]:
    """Instances whose ranks only report losing a peer: after a grace nobody named a culprit
    (its node may be gone, or its worker too), so retire with what is known."""
    decisions: list[LogEvent] = []
    for instance in state.instances.values():
        if instance.retired or not instance.failed:
            continue
        culprit = judge_instance(state, instance)
        if culprit is None or culprit.cause != "unreported":
            continue  # the core retired it already, or will on its next event
        lost = [instance.runners[rank] for rank in culprit.followers]
        lost_at = liveness.losses.get(instance.instance_id, max(r.changed_at for r in lost))
        if now_ns - lost_at > policy.peer_loss_grace_seconds * NS:
            silent = [rank for rank in culprit.ranks if rank not in culprit.followers]
            reason = f"rank {lost[0].rank} lost its peers; rank(s) {silent} never reported (node or worker gone?)"
            rank = culprit.sole_rank if silent else None
            decisions += retire_instance(stamper, instance, reason, "peer_lost", rank=rank)
    return decisions


def _node_timeouts(
    state: State, now_ns: int, liveness: Liveness, policy: MasterPolicy, stamper: Stamper
) -> list[LogEvent]:
    """Nodes up that the master has not heard from for `node_timeout_seconds` of its own sight.
    A node it has not noticed yet is not judged (`hearing.Hearing.notice` notices every node up
    on the first tick that sees it). The id names the announcement timed out (its `changed_at`,
    the same in every master's State), so each announcement is timed out at most once."""
    timed_out: list[LogEvent] = []
    for node in state.nodes.values():
        last = liveness.nodes.get(node.node_id)
        if node.status != "up" or last is None:
            continue
        if liveness.node_silence.get(node.node_id, now_ns - last) > policy.node_timeout_seconds * NS:
            env = stamper.stamp(f"timeout-{node.node_id}-{node.changed_at}")
            last_seen = last + liveness.wall_offset_ns
            timed_out.append(NodeTimedOut(env=env, node_id=node.node_id, last_seen=last_seen))
    return timed_out


def _stalled_tasks(
    state: State, now_ns: int, liveness: Liveness, policy: MasterPolicy, stamper: Stamper
) -> list[LogEvent]:
    decisions: list[LogEvent] = []
    for instance in state.instances.values():
        if instance.retired or not instance.queue:
            continue
        task = state.tasks[instance.queue[0]]
        silence = liveness.activity_silence.get(instance.instance_id)
        if silence is None:  # no arrivals (a tool replaying a log): the State's stamps
            silence = now_ns - max(instance.head_since, *batch_activity(state, instance))
        if silence <= policy.task_stall_seconds * NS:
            continue
        diagnosis = describe_positions(task, instance, liveness, now_ns)
        culprit = blame(state, instance, task, liveness, now_ns)
        decisions.append(
            TaskStalled(env=stamper.stamp(f"stall-{task.task_id}"), task_id=task.task_id, diagnosis=diagnosis)
        )
        error = f"stalled: no progress for {policy.task_stall_seconds:g}s ({diagnosis})"
        # The group is wedged (a rank frozen or gone, a collective nobody completes): the only cure
        # is new processes, so the instance is retired and its runners stopped.
        batch = sorted({t for beat in liveness.beats_of(instance).values() for t in beat.tasks})
        with_batch = f" in a batch of {len(batch)} ({', '.join(batch)})" if len(batch) > 1 else ""
        reason = f"task {task.task_id} stalled{with_batch}; likely culprit: {culprit.describe()}"
        decisions += retire_instance(stamper, instance, reason, "stalled", rank=culprit.sole_rank, head_error=error)
    return decisions


def batch_activity(state: State, instance: InstanceInfo) -> list[int]:
    """When the ranks last moved any task of the running batch. The first `max_batch` tasks of the
    queue are the batch (the ranks admit in log order); its streams step together, so any of them
    advancing shows the group alive, and a frozen rank stops them all. A task the ranks have not
    started (no `PrefillStarted`: still waiting for a slot) shows nothing, so an assignment alone
    never postpones the deadline; the head always counts, as before batching."""
    window = instance.queue[: instance.settings.max_batch]
    tasks = [state.tasks[task_id] for task_id in window]
    return [t.last_activity_at for n, t in enumerate(tasks) if n == 0 or t.prefill]


def blame(state: State, instance: InstanceInfo, task: TaskInfo, liveness: Liveness, now_ns: int) -> Culprit:
    """Who stalled `task` on `instance`, as the master sees it at `now_ns`: the log's State and the
    newest heartbeat of each rank, judged with the stalled-task bounds."""
    beats = liveness.beats_of(instance)
    return name_culprit(TaskEvidence.about_task(state, instance, task, beats, now_ns, STALLED_TASK_BOUNDS))


def _overdue_tasks(
    state: State, now_ns: int, liveness: Liveness, policy: MasterPolicy, stamper: Stamper
) -> list[LogEvent]:
    """Tasks past their request deadline, or waiting too long for an instance to be ready, fail (one
    waiting for a place on a ready instance, `fair_share.py`, waits for its turn). The ranks of
    an assigned one stop it as they stop a cancelled one (a master's `TaskFailed` is a stop for
    them); their own late `TaskCompleted(cancelled)` then finds it ended. Decided here rather than
    by the API that took the request, so the deadline holds when that API restarts or its client
    is gone, and every replica's client sees the same end. A task's age counts from when the master
    first saw it (`Liveness.tasks`), never from the API's `created_at`: the two are different
    hosts' clocks. A master that starts after the task was created counts from its start, so
    across a restart a deadline may run late by up to its length, never early; a stand-by counts
    as the leader does (it notices every tick), so a take-over keeps the count."""
    failed: list[LogEvent] = []
    deadline_ns = policy.request_timeout_seconds * NS
    served = {i.model for i in state.instances.values() if i.ready}  # a task of these waits for a place
    for task in live_tasks_of(state):  # not ended, by construction
        age = now_ns - liveness.tasks.get(task.task_id, task.created_at)
        if deadline_ns and age > deadline_ns:
            error = f"request timed out after {policy.request_timeout_seconds:g} s (request_timeout_seconds)"
            env = stamper.stamp(f"master-fail-{task.task_id}")
            failed.append(TaskFailed(env=env, task_id=task.task_id, error=error, deadline=True))
        elif task.instance_id is None and task.model not in served and age > policy.assign_timeout_seconds * NS:
            error = f"no ready instance of model {task.model!r} within {policy.assign_timeout_seconds:g}s"
            failed.append(
                TaskFailed(env=stamper.stamp(f"master-fail-{task.task_id}"), task_id=task.task_id, error=error)
            )
    return failed


def describe_positions(task: TaskInfo, instance: InstanceInfo, liveness: Liveness, now_ns: int) -> str:
    """One line per rank: where it last was and how long ago (since the master first saw it
    there); the decode step its heartbeats last showed (the master folds no chunks:
    `hearing.activity_tokens`); plus an unacted cancel."""
    beats = liveness.beats_of(instance)
    parts: list[str] = []
    for runner in instance.runners:
        position = task.progress.get(runner.rank)
        if position is None:
            where = "no prefill progress" if runner.rank in task.prefill else "never started this task"
            parts.append(f"rank {runner.rank} ({runner.status}): {where}")
            continue
        ago = (now_ns - liveness.progress.get((task.task_id, runner.rank), position.at)) / NS
        parts.append(
            f"rank {runner.rank} ({runner.status}): prefill iteration {position.iteration} "
            f"({position.processed}/{position.total} tokens) {ago:.1f}s ago"
        )
    steps = [b.iteration for b in beats.values() if b.phase == "decode" and task.task_id in b.tasks]
    if steps:
        parts.append(f"decoding: step {max(steps)}")
    if task.cancel_reason is not None:
        requested = liveness.cancels.get(task.task_id, task.cancelled_at)
        parts.append(f"cancel ({task.cancel_reason}) requested {(now_ns - requested) / NS:.1f}s ago, not acted on")
    return "; ".join(parts)
