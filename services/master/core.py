"""The master's pure core: (state, event) -> events. No I/O, no clock, no randomness.

`decide` runs after the shell has folded `event` into `state`; it looks only at the part of the
State the event can change. `reconcile` runs once at start-up over the whole State, so that what
arrived while no master was running is decided now, and what was decided before is not decided
again (a task already assigned is not in the waiting set).

Event ids of decisions are derived from their cause (`assign-<task>`, `place-<model>-<n>`, ...):
two decisions taken on the same stale State before the first one came back through the log
carry the same id, and JetStream's de-duplication stores one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    ModelUnavailable,
    NodeJoined,
    NodeLeft,
    NodeTimedOut,
    RunnerStatusChanged,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
)
from events.culprit import STALLED_TASK_BOUNDS, Culprit, Evidence, name_culprit
from events.retention import live_tasks_of
from events.runner_settings import RunnerSettings
from events.stamp import Stamper
from events.state import InstanceInfo, State, TaskInfo
from events.subjects import model_token
from services.master.placement import PlacementError, nodes_up, plan_instance


class UnknownModel(Exception):
    """A task names a model that no node can load; the message lists the known ones."""


class ModelCatalog(Protocol):
    def layers_of(self, model: str) -> int:
        """The number of transformer layers; raises UnknownModel."""
        ...


class MasterPolicy(msgspec.Struct, frozen=True, kw_only=True):
    runner_settings: RunnerSettings = msgspec.field(default_factory=RunnerSettings)  # what each placed rank runs with
    ring_base_port: int = 52100
    max_nodes_per_instance: int = 8
    default_model: str | None = None  # kept placed once enough nodes joined (shoal up)
    min_nodes_for_default: int = 1
    max_failed_placements: int = 3  # consecutive placements that never got ready
    task_stall_seconds: float = 30.0
    node_timeout_seconds: float = 10.0
    assign_timeout_seconds: float = 600.0
    request_timeout_seconds: float = 600.0  # a task not ended this long after its creation fails; 0 = never
    peer_loss_grace_seconds: float = 2.0  # wait this long for the culprit when ranks only lost a peer


class MasterCore:
    def __init__(self, policy: MasterPolicy, catalog: ModelCatalog, stamper: Stamper) -> None:
        self.policy = policy
        self.catalog = catalog
        self.stamper = stamper

    # --- entry points ------------------------------------------------------------------------

    def decide(self, state: State, event: LogEvent) -> list[LogEvent]:
        match event:
            case TaskCreated():
                return self._serve_waiting(state, event.model)
            case TaskCancelled():
                task = state.tasks.get(event.task_id)  # None: a late cancel of an evicted task
                return [] if task is None else self._finish_if_waiting(task)
            case RunnerStatusChanged():
                instance = state.instances[event.instance_id]
                if instance.retired:
                    return []
                if instance.failed:
                    culprit = judge_instance(state, instance)
                    if culprit is None or culprit.cause == "unreported":
                        return []  # only casualties so far: wait for the rank that died (watchdog grace)
                    return self._retire(state, instance, _runner_failure(instance, culprit))
                return self._serve_waiting(state, instance.model) if instance.ready else []
            case InstanceRetired():
                model = state.instances[event.instance_id].model
                return [*self._serve_waiting(state, model), *self._ensure_default(state)]
            case NodeJoined():
                return self._ensure_default(state)
            case NodeLeft() | NodeTimedOut():
                return self._retire_on_node(state, event.node_id)
            case _:
                return []

    def reconcile(self, state: State) -> list[LogEvent]:
        """Everything owed by the current State, for a master that just (re)started."""
        decisions: list[LogEvent] = []
        for task in _waiting_tasks(state, model=None):
            decisions += self._finish_if_waiting(task)
        for instance in state.instances.values():
            if instance.retired:
                continue
            broken = _broken_reason(state, instance)
            if broken:
                decisions += self._retire(state, instance, broken)
        if decisions:
            return decisions  # placement and assignment follow once these are in the log
        for model in sorted({t.model for t in _waiting_tasks(state, model=None)}):
            decisions += self._serve_waiting(state, model)
        return decisions or self._ensure_default(state)

    # --- rules -------------------------------------------------------------------------------

    def _serve_waiting(self, state: State, model: str) -> list[LogEvent]:
        waiting = [t for t in _waiting_tasks(state, model) if t.cancel_reason is None]
        if not waiting:
            return []
        ready = [i for i in _live_instances(state, model) if i.ready]
        if ready:
            return self._assign(waiting, ready)
        if any(not i.failed for i in _live_instances(state, model)):
            return []  # an instance is loading; the tasks are assigned once it is ready
        return self._place(state, model, waiting)

    def _assign(self, waiting: Sequence[TaskInfo], ready: Sequence[InstanceInfo]) -> list[LogEvent]:
        queued = {i.instance_id: len(i.queue) for i in ready}
        decisions: list[LogEvent] = []
        for task in waiting:
            target = min(ready, key=lambda i: (queued[i.instance_id], i.placed_seq)).instance_id
            queued[target] += 1
            env = self.stamper.stamp(f"assign-{task.task_id}")
            decisions.append(TaskAssigned(env=env, task_id=task.task_id, instance_id=target))
        return decisions

    def _place(self, state: State, model: str, waiting: Sequence[TaskInfo]) -> list[LogEvent]:
        failures = _failed_placements(state, model)
        if failures >= self.policy.max_failed_placements:
            last = _last_retire_reason(state, model)
            return self._fail_all(waiting, f"model {model!r} failed to load {failures} times in a row: {last}")
        try:
            placed = self._plan(state, model)
        except (PlacementError, UnknownModel) as exc:
            return self._fail_all(waiting, str(exc))
        return [placed]

    def _plan(self, state: State, model: str) -> InstancePlaced:
        layers = self.catalog.layers_of(model)
        plan = plan_instance(
            state,
            model,
            layers,
            base_port=self.policy.ring_base_port,
            max_nodes=self.policy.max_nodes_per_instance,
        )
        return InstancePlaced(
            env=self.stamper.stamp(f"place-{plan.instance_id}"),
            instance_id=plan.instance_id,
            model=model,
            shards=plan.shards,
            ring_hosts=plan.ring_hosts,
            settings=self.policy.runner_settings,
        )

    def _ensure_default(self, state: State) -> list[LogEvent]:
        model = self.policy.default_model
        if model is None or len(nodes_up(state)) < self.policy.min_nodes_for_default:
            return []
        if _live_instances(state, model):
            return []
        if _failed_placements(state, model) >= self.policy.max_failed_placements:
            return []
        try:
            return [self._plan(state, model)]
        except PlacementError:
            return []  # nothing waits on it; a task for it will get the error
        except UnknownModel as exc:
            return self._say_unavailable(state, model, str(exc))

    def _say_unavailable(self, state: State, model: str, error: str) -> list[LogEvent]:
        """Tell the log why the default model cannot be placed (`shoal up`, /healthz and /v1/models
        show it), once per distinct reason: every node that joins asks again."""
        known = state.models.get(model)
        if known is not None and known.unavailable == error:
            return []
        env = self.stamper.stamp(f"unavailable-{model_token(model)}-{state.last_seq}")
        return [ModelUnavailable(env=env, model=model, error=error)]

    def _finish_if_waiting(self, task: TaskInfo) -> list[LogEvent]:
        if task.ended or task.cancel_reason is None or task.instance_id is not None:
            return []  # an assigned task is ended by its ranks, which agree to skip it
        env = self.stamper.stamp(f"cancel-waiting-{task.task_id}")
        return [TaskCompleted(env=env, task_id=task.task_id, finish_reason="cancelled")]

    def _retire(self, state: State, instance: InstanceInfo, reason: str) -> list[LogEvent]:
        culprit = judge_instance(state, instance)
        return retire_instance(self.stamper, instance, reason, rank=culprit.sole_rank if culprit else None)

    def _retire_on_node(self, state: State, node_id: str) -> list[LogEvent]:
        decisions: list[LogEvent] = []
        for instance in state.instances.values():
            if not instance.retired and any(s.node_id == node_id for s in instance.shards):
                decisions += self._retire(state, instance, _broken_reason(state, instance) or f"node {node_id} is gone")
        return decisions

    def _fail_all(self, tasks: Sequence[TaskInfo], error: str) -> list[LogEvent]:
        return [
            TaskFailed(env=self.stamper.stamp(f"master-fail-{t.task_id}"), task_id=t.task_id, error=error)
            for t in tasks
        ]


def retire_instance(
    stamper: Stamper, instance: InstanceInfo, reason: str, *, rank: int | None, head_error: str | None = None
) -> list[LogEvent]:
    """Retire an instance whose group is broken, failing every task queued on it (its ranks will
    never run them). `head_error` replaces the message of the task the ranks were running."""
    decisions: list[LogEvent] = [
        InstanceRetired(
            env=stamper.stamp(f"retire-{instance.instance_id}"), instance_id=instance.instance_id, reason=reason
        )
    ]
    for position, task_id in enumerate(instance.queue):
        error = head_error if position == 0 and head_error else f"instance {instance.instance_id} was retired: {reason}"
        decisions.append(
            TaskFailed(env=stamper.stamp(f"master-fail-{task_id}"), task_id=task_id, error=error, rank=rank)
        )
    return decisions


# --- queries over the State -------------------------------------------------------------------


def _waiting_tasks(state: State, model: str | None) -> list[TaskInfo]:
    """Tasks not yet assigned and not ended, oldest first."""
    return [t for t in live_tasks_of(state) if t.instance_id is None and (model is None or t.model == model)]


def _live_instances(state: State, model: str) -> list[InstanceInfo]:
    return sorted(
        (i for i in state.instances.values() if i.model == model and not i.retired), key=lambda i: i.placed_seq
    )


def _failed_placements(state: State, model: str) -> int:
    """Consecutive retired instances of `model` that never got ready, newest first."""
    count = 0
    for instance in sorted(state.instances.values(), key=lambda i: -i.placed_seq):
        if instance.model != model:
            continue
        if instance.became_ready_at or not instance.retired:
            break
        count += 1
    return count


def _last_retire_reason(state: State, model: str) -> str:
    retired = [i for i in state.instances.values() if i.model == model and i.retired]
    return max(retired, key=lambda i: i.placed_seq).retire_reason if retired else ""


def judge_instance(state: State, instance: InstanceInfo) -> Culprit | None:
    """Who broke `instance`, from the log alone: a node gone, a rank down (the watchdog adds what
    the heartbeats say). Judged as of the last status a rank reported."""
    reported_at = max(r.changed_at for r in instance.runners)
    return name_culprit(Evidence.about_instance(state, instance, {}, reported_at, STALLED_TASK_BOUNDS))


def _runner_failure(instance: InstanceInfo, culprit: Culprit | None) -> str:
    blamed = [instance.runners[rank] for rank in culprit.ranks] if culprit else []
    for runner in [*blamed, *instance.runners]:
        if runner.down:
            detail = f": {runner.detail}" if runner.detail else ""
            return f"rank {runner.rank} on node {runner.node_id} {runner.status}{detail}"
    return "a runner failed"


def _broken_reason(state: State, instance: InstanceInfo) -> str:
    if instance.failed:
        return _runner_failure(instance, judge_instance(state, instance))
    for shard in instance.shards:
        node = state.nodes.get(shard.node_id)
        if node is None or node.status != "up":
            status = node.status if node is not None else "unknown"
            return f"node {shard.node_id} (rank {shard.rank}) is {status.replace('_', ' ')}"
    return ""
