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

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import msgspec

from events.apply import apply
from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    ModelLoadRequested,
    ModelUnavailable,
    ModelUnloadRequested,
    NodeJoined,
    NodeLeft,
    NodeTimedOut,
    Origin,
    PrefillStarted,
    RunnerStatusChanged,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
)
from events.culprit import STALLED_TASK_BOUNDS, Culprit, Evidence, name_culprit
from events.ids import InstanceId
from events.origins import MASTER
from events.retention import live_tasks_of
from events.runner_detail import detail_headline
from events.runner_settings import RunnerSettings
from events.stamp import Stamper
from events.state import InstanceInfo, State, TaskInfo
from events.subjects import model_token
from events.vocabulary import RetireCause
from services.master.capacity import ModelFacts
from services.master.fair_share import fair_assignments
from services.master.lifecycle import (
    draining,
    evictable,
    idle_to_unload,
    instance_ids,
    keep_alive_of,
    moving,
    operator_wants,
    pinned,
    replica_candidates,
    unload_drained,
    unloaded_since_placed,
    wanted_placed,
)
from services.master.placement import (
    DEFAULT_RING_BASE_PORT,
    NodeCount,
    NoRoom,
    PlacementError,
    PlacementFailures,
    PlacementRequest,
    PlannedInstance,
    RetryPolicy,
    nodes_up,
    placement_failures,
    plan_instance,
    refusal,
)

# Seconds since this master first saw each failed placement retired (`placement.RetryClock`): what a
# placement backoff is judged by. On an event nothing has waited: the tick retries.
Waited = Mapping[InstanceId, float]
NO_WAIT: Waited = MappingProxyType({})


class UnknownModel(Exception):
    """A task names a model that no node can load; the message lists the known ones."""


class ModelCatalog(Protocol):
    def facts_of(self, model: str) -> ModelFacts:
        """The layer count and weight bytes; raises UnknownModel."""
        ...


class MasterPolicy(msgspec.Struct, frozen=True, kw_only=True):
    runner_settings: RunnerSettings = msgspec.field(default_factory=RunnerSettings)  # what each placed rank runs with
    ring_base_port: int = DEFAULT_RING_BASE_PORT
    nodes_per_instance: NodeCount = NodeCount()  # an instance is split over this many nodes at most/least
    models: tuple[str, ...] = ()  # configured: placed when they fit, once `place_after_nodes` nodes joined
    place_after_nodes: int = 1  # `shoal up` waits for all its workers, so placement sees every node
    kv_reserve_fraction: float = 0.25  # KV room placement reserves beside a rank's weights, as a fraction of them
    model_keep_alive_seconds: float = 1800.0  # idle this long: retired; 0 = at once; negative = never
    max_instances_per_model: int = 1  # replicas of a busy model, up to this many instances in all
    replica_after_wait_seconds: float = 5.0  # tasks waiting this long for a place: another instance
    placement_retry: RetryPolicy = msgspec.field(default_factory=RetryPolicy)  # after placements that never got ready
    instance_ready_timeout_seconds: float = 900.0  # placed but not ready this long: retired (watchdog)
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
        # Placements up to this seq are forgiven: a fresh master retries a model at once, whatever
        # failed before it started (set by `reconcile`).
        self.forgiven_seq = 0

    # --- entry points ------------------------------------------------------------------------

    def decide(self, state: State, event: LogEvent) -> list[LogEvent]:
        # A decision is a function of the log: no clock is read, so a model backing off after
        # failed placements is placed again by the tick (`retry_placements`), never on an event.
        waited = NO_WAIT
        match event:
            case TaskCreated():
                return self._serve_waiting(state, event.model, waited)
            case TaskCancelled():
                task = state.tasks.get(event.task_id)  # None: a late cancel of an evicted task
                return [] if task is None else self._finish_if_waiting(task)
            case TaskAssigned():
                return self._fail_if_assigned_to_retired(state, event)
            case TaskCompleted() | TaskFailed() | PrefillStarted():
                # a place freed, or a task handed ahead joined the batch; an unloaded model's
                # instance that just ended its last task goes
                return [*self._fill_places(state), *self._retire_drained(state)]
            case RunnerStatusChanged():
                return self._on_runner_status(state, state.instances[event.instance_id], waited)
            case InstanceRetired():
                model = state.instances[event.instance_id].model
                return self._then(state, self._serve_waiting(state, model, waited), self._keep_placed, waited)
            case InstancePlaced():
                return self._keep_placed(state, waited)  # one placement at a time: the next sees this one
            case NodeJoined():
                served = self._then(state, self._serve_all_waiting(state, waited), self._keep_placed, waited)
                return served or self._move_to_fewer_nodes(state)
            case NodeLeft() | NodeTimedOut():
                return self._retire_on_node(state, event.node_id)
            case ModelLoadRequested():
                return self._keep_placed(state, waited)
            case ModelUnloadRequested():
                return self._retire_drained(state)
            case ModelUnavailable():
                return self._keep_placed(state, waited)  # the models kept placed after this one
            case _:
                return []

    def _fail_if_assigned_to_retired(self, state: State, event: TaskAssigned) -> list[LogEvent]:
        """An assignment stored after its instance's retirement: decided on a State that did not
        hold the retirement yet (this master's own, still on its way to the log, or another
        master's). The instance's ranks are gone and the retirement failed only the tasks queued
        before it, so nothing else would end this one: it fails as they did."""
        task = state.tasks.get(event.task_id)
        instance = state.instances.get(event.instance_id)
        if task is None or task.ended or instance is None or not instance.retired:
            return []
        error = f"instance {instance.instance_id} was retired: {instance.retire_reason}"
        return [TaskFailed(env=self.stamper.stamp(f"master-fail-{task.task_id}"), task_id=task.task_id, error=error)]

    def _on_runner_status(self, state: State, instance: InstanceInfo, waited: Waited) -> list[LogEvent]:
        if instance.retired:
            return []
        if instance.failed:
            culprit = judge_instance(state, instance)
            if culprit is None or culprit.cause == "unreported":
                return []  # only casualties so far: wait for the rank that died (watchdog grace)
            return self._retire(state, instance, _runner_failure(instance, culprit), "runner_down")
        if not instance.ready:
            return []
        # a replacement that got ready takes the new tasks; the one it replaces goes once idle
        return [*self._serve_waiting(state, instance.model, waited), *self._retire_drained(state)]

    def reconcile(self, state: State) -> list[LogEvent]:
        """Everything owed by the current State, for a master that just (re)started. Earlier failed
        placements are forgiven: a restart is how an operator says "try again"."""
        self.forgiven_seq = state.last_seq
        decisions: list[LogEvent] = []
        for task in _waiting_tasks(state, model=None):
            decisions += self._finish_if_waiting(task)
        for instance in state.instances.values():
            if instance.retired:
                continue
            broken = _broken(state, instance)
            if broken is not None:
                decisions += self._retire(state, instance, *broken)
        decisions += self._retire_drained(state)
        if decisions:
            return decisions  # placement and assignment follow once these are in the log
        return self._then(state, self._serve_all_waiting(state, NO_WAIT), self._keep_placed, NO_WAIT)

    def retry_placements(self, state: State, waited: Waited) -> list[LogEvent]:
        """Place again each model whose last placements failed once its backoff is over (or was
        forgiven), or that waited for memory, if tasks wait for it or it is kept placed. The
        master's tick calls this: no event marks the end of a backoff."""
        placed = self._then(state, self._serve_all_waiting(state, waited), self._keep_placed, waited)
        return placed or self._move_to_fewer_nodes(state)

    def unload_idle(self, state: State, idle_seconds: Mapping[InstanceId, float]) -> list[LogEvent]:
        """Retire the instances idle for longer than the keep-alive (`idle_seconds`: by the master's
        own clock, from its shell's `IdleClock`). The tick calls this."""
        keep_alive = self.policy.model_keep_alive_seconds
        decisions: list[LogEvent] = []
        for instance in idle_to_unload(state, idle_seconds, keep_alive):
            own = keep_alive_of(instance, keep_alive)
            reason = f"idle for {idle_seconds[instance.instance_id]:.0f}s (keep-alive {own:g}s)"
            decisions += self._retire(state, instance, reason, "idle")
        return decisions

    def grow_replicas(self, state: State, waited_seconds: Mapping[str, float]) -> list[LogEvent]:
        """Place another instance of each model whose tasks have waited for a place long enough
        (`waited_seconds`: by the master's own clock, from its shell's `WaitClock`), where memory
        allows without evicting anything; one placement a tick, so the next sees its memory."""
        policy = self.policy
        for model in replica_candidates(
            state, waited_seconds, policy.replica_after_wait_seconds, policy.max_instances_per_model
        ):
            try:
                plan = plan_instance(state, self._request(state, model))
            except (PlacementError, UnknownModel):
                continue  # no room for another: the tasks wait for a place on those it has
            count = len(_live_instances(state, model)) + 1
            reason = f"replica {count} of {policy.max_instances_per_model}: tasks waited {waited_seconds[model]:.0f}s"
            return [self._placed(msgspec.structs.replace(plan, reason=f"{reason}; {plan.reason}"))]
        return []

    def failures(self, state: State, model: str) -> PlacementFailures:
        return placement_failures(state, model, after_seq=self.forgiven_seq)

    # --- rules -------------------------------------------------------------------------------

    def _then(
        self,
        state: State,
        first: list[LogEvent],
        rule: Callable[[State, Waited], list[LogEvent]],
        waited: Waited,
    ) -> list[LogEvent]:
        """`first`, then what `rule` decides on the State as it will be once `first` is folded: a
        placement decided after another must see the memory the first one takes."""
        return [*first, *rule(_with_decisions(state, first), waited)]

    def _serve_all_waiting(self, state: State, waited: Waited) -> list[LogEvent]:
        """Serve every model with waiting tasks, each on the State with the decisions before it."""
        decisions: list[LogEvent] = []
        ahead = state
        for model in sorted({t.model for t in _assignable_tasks(state, model=None)}):
            live = _live_instances(ahead, model)
            if not live or any(i.ready for i in live):  # else its instances load, or failed and go first
                served = self._serve_waiting(ahead, model, waited)
                decisions += served
                ahead = _with_decisions(ahead, served)
        return decisions

    def _serve_waiting(self, state: State, model: str, waited: Waited) -> list[LogEvent]:
        waiting = _assignable_tasks(state, model)
        if not waiting:
            return []
        live = _live_instances(state, model)
        ready = [i for i in live if i.ready and not draining(state, i)]
        if ready:
            return self._assign(state, waiting, ready)
        if any(not i.failed for i in live):
            return []  # an instance is loading (or draining); the tasks are served once it is ready (gone)
        return self._place(state, model, waiting, waited)

    def _assign(self, state: State, waiting: Sequence[TaskInfo], ready: Sequence[InstanceInfo]) -> list[LogEvent]:
        """Hand waiting tasks to the ready instances while they have room, a fair share per API key
        (`fair_share.py`); the others wait for a place to free."""
        held = {t: state.tasks[t] for instance in ready for t in instance.queue if t in state.tasks}
        return [
            TaskAssigned(env=self.stamper.stamp(f"assign-{task_id}"), task_id=task_id, instance_id=target)
            for task_id, target in fair_assignments(waiting, ready, held)
        ]

    def _fill_places(self, state: State) -> list[LogEvent]:
        """A task that ends, or one handed ahead that joins its batch, frees a place on its
        instance: tasks waiting for a place on a ready instance take them (every model's: the ended
        task may be evicted from the State already)."""
        by_model: dict[str, list[TaskInfo]] = {}
        for task in _assignable_tasks(state, model=None):
            by_model.setdefault(task.model, []).append(task)
        decisions: list[LogEvent] = []
        for model, waiting in sorted(by_model.items()):
            ready = [i for i in _live_instances(state, model) if i.ready and not draining(state, i)]
            if ready:
                decisions += self._assign(state, waiting, ready)
        return decisions

    def _place(self, state: State, model: str, waiting: Sequence[TaskInfo], waited: Waited) -> list[LogEvent]:
        """Place an instance for the waiting tasks; after failed placements, only once the backoff is
        over (else the tick places it then), and refuse the tasks while the model is refused. With
        no room now but room once busy instances finish, the tasks wait (the tick tries again)."""
        failures = self.failures(state, model)
        retry = self.policy.placement_retry
        if self._backing_off(failures, waited):
            return self._fail_all(waiting, refusal(model, failures, retry)) if retry.refused(failures) else []
        try:
            return self._plan_with_room(state, model)
        except NoRoom as exc:
            return [] if self._fits_once_others_go(state, model) else self._fail_all(waiting, str(exc))
        except (PlacementError, UnknownModel) as exc:
            return self._fail_all(waiting, str(exc))

    def _plan_with_room(self, state: State, model: str) -> list[LogEvent]:
        """The placement of `model`, evicting idle instances of other models, least recently used
        first, when that is what makes room; raises NoRoom when even that does not."""
        request = self._request(state, model)
        try:
            return [self._placed(plan_instance(state, request))]
        except NoRoom:
            victims = evictable(state, for_model=model)
            for count in range(1, len(victims) + 1):
                chosen = victims[:count]
                try:
                    plan = plan_instance(state, request, without=instance_ids(chosen))
                except NoRoom:
                    continue
                why = f"evicted to make room for {model!r} (idle, least recently used)"
                evictions = [e for victim in chosen for e in self._retire(state, victim, why, "evicted")]
                return [*evictions, self._placed(plan)]
            raise

    def _fits_once_others_go(self, state: State, model: str) -> bool:
        """Whether `model` would fit if every instance that may ever be let go (all but the pinned
        models') were gone: then its tasks wait for busy instances to finish."""
        gone = {i.instance_id for i in state.instances.values() if not i.retired and not pinned(state, i.model)}
        try:
            plan_instance(state, self._request(state, model), without=gone)
        except (PlacementError, UnknownModel):
            return False
        return True

    def _request(self, state: State, model: str) -> PlacementRequest:
        status = state.models.get(model)
        hints = status.hints if status is not None else None
        count = self.policy.nodes_per_instance
        if hints is not None:
            count = NodeCount(
                least=max(count.least, hints.min_nodes),
                most=min(count.most, hints.max_nodes) if hints.max_nodes else count.most,
            )
        return PlacementRequest(
            model=model,
            facts=self.catalog.facts_of(model),
            count=count,
            only_nodes=tuple(hints.nodes) if hints is not None else (),
            kv_reserve_fraction=self.policy.kv_reserve_fraction,
            base_port=self.policy.ring_base_port,
        )

    def _placed(self, plan: PlannedInstance) -> InstancePlaced:
        return InstancePlaced(
            env=self.stamper.stamp(f"place-{plan.instance_id}"),
            instance_id=plan.instance_id,
            model=plan.model,
            shards=plan.shards,
            ring_hosts=plan.ring_hosts,
            settings=self.policy.runner_settings,
            reason=plan.reason,
        )

    def _backing_off(self, failures: PlacementFailures, waited: Waited) -> bool:
        """Whether the model's last placements failed and its backoff is not over yet."""
        if not failures.count:
            return False
        since = waited.get(failures.newest) if failures.newest is not None else None
        return since is None or not self.policy.placement_retry.due(failures, since)

    def _keep_placed(self, state: State, waited: Waited) -> list[LogEvent]:
        """Place the first model kept placed (configured, or loaded by an operator) that has no live
        instance, once enough nodes joined; the next one follows when this placement is folded
        (`decide` on `InstancePlaced`), so it sees the memory this one takes."""
        if len(nodes_up(state)) < self.policy.place_after_nodes:
            return []
        for model in wanted_placed(state, self.policy.models):
            if _live_instances(state, model):
                continue
            if self._backing_off(self.failures(state, model), waited):
                continue  # the tick places it once the backoff is over
            decisions = self._try_plan(state, model, evict=operator_wants(state, model))
            if decisions:
                return decisions  # placed it, or said why not; the others follow once this is folded
        return []

    def _try_plan(self, state: State, model: str, *, evict: bool) -> list[LogEvent]:
        """A placement nothing waits on yet: one that cannot be planned says why, once. Only an
        operator's load evicts idle instances for it: a configured model that does not fit waits
        for a request (or for room), rather than taking the room of one that was placed first."""
        try:
            if not evict:
                return [self._placed(plan_instance(state, self._request(state, model)))]
            return self._plan_with_room(state, model)
        except NoRoom as exc:
            return self._say_unavailable(state, model, str(exc))
        except PlacementError:
            return []  # no node is up; nothing waits on it; a task for it will get the error
        except UnknownModel as exc:
            return self._say_unavailable(state, model, str(exc))

    def _say_unavailable(self, state: State, model: str, error: str) -> list[LogEvent]:
        """Tell the log why a model kept placed cannot be placed (`shoal up`, /healthz and
        /v1/models show it), once per distinct reason: every node that joins asks again."""
        known = state.models.get(model)
        if known is not None and known.unavailable == error:
            return []
        env = self.stamper.stamp(f"unavailable-{model_token(model)}-{state.last_seq}")
        return [ModelUnavailable(env=env, model=model, error=error)]

    def _retire_drained(self, state: State) -> list[LogEvent]:
        decisions: list[LogEvent] = []
        for instance in unload_drained(state):
            if unloaded_since_placed(state, instance):
                reason, cause = f"model {instance.model!r} unloaded by an operator", "unloaded"
            else:
                reason, cause = "an instance on fewer nodes took over from it", "moved"
            decisions += self._retire(state, instance, reason, cause)
        return decisions

    def _move_to_fewer_nodes(self, state: State) -> list[LogEvent]:
        """An instance split over more nodes than its model needs now (a bigger node joined, memory
        freed) is moved: a new instance on fewer nodes is placed beside it and warmed; once it is
        ready it takes the new tasks, and the old one is retired when it holds none (no running
        stream is cut). One move at a time, and only where both fit at once."""
        if moving(state):
            return []
        for instance in sorted(state.instances.values(), key=lambda i: i.placed_seq):
            if instance.retired or not instance.ready or instance.world_size < 2 or draining(state, instance):
                continue
            try:
                plan = plan_instance(state, self._request(state, instance.model))
            except (PlacementError, UnknownModel):
                continue
            if len(plan.shards) >= instance.world_size:
                continue
            why = f"moves {instance.instance_id} from {instance.world_size} nodes to {len(plan.shards)}; {plan.reason}"
            placed = self._placed(msgspec.structs.replace(plan, reason=why))
            return [msgspec.structs.replace(placed, replaces=instance.instance_id)]
        return []

    def _finish_if_waiting(self, task: TaskInfo) -> list[LogEvent]:
        if task.ended or task.cancel_reason is None or task.instance_id is not None:
            return []  # an assigned task is ended by its ranks, which agree to skip it
        env = self.stamper.stamp(f"cancel-waiting-{task.task_id}")
        return [TaskCompleted(env=env, task_id=task.task_id, finish_reason="cancelled")]

    def _retire(self, state: State, instance: InstanceInfo, reason: str, cause: RetireCause) -> list[LogEvent]:
        culprit = judge_instance(state, instance)
        return retire_instance(self.stamper, instance, reason, cause, rank=culprit.sole_rank if culprit else None)

    def _retire_on_node(self, state: State, node_id: str) -> list[LogEvent]:
        decisions: list[LogEvent] = []
        for instance in state.instances.values():
            if not instance.retired and any(s.node_id == node_id for s in instance.shards):
                broken = _broken(state, instance) or (f"node {node_id} is gone", "node_gone")
                decisions += self._retire(state, instance, *broken)
        return decisions

    def _fail_all(self, tasks: Sequence[TaskInfo], error: str) -> list[LogEvent]:
        return [
            TaskFailed(env=self.stamper.stamp(f"master-fail-{t.task_id}"), task_id=t.task_id, error=error)
            for t in tasks
        ]


def retire_instance(
    stamper: Stamper,
    instance: InstanceInfo,
    reason: str,
    cause: RetireCause,
    *,
    rank: int | None,
    head_error: str | None = None,
) -> list[LogEvent]:
    """Retire an instance whose group is broken, failing every task queued on it (its ranks will
    never run them). `head_error` replaces the message of the task the ranks were running."""
    env = stamper.stamp(f"retire-{instance.instance_id}")
    decisions: list[LogEvent] = [InstanceRetired(env=env, instance_id=instance.instance_id, reason=reason, cause=cause)]
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


def _assignable_tasks(state: State, model: str | None) -> list[TaskInfo]:
    """The waiting tasks not cancelled (a cancelled one is completed, not assigned), oldest first."""
    return [t for t in _waiting_tasks(state, model) if t.cancel_reason is None]


def _live_instances(state: State, model: str) -> list[InstanceInfo]:
    return sorted(
        (i for i in state.instances.values() if i.model == model and not i.retired), key=lambda i: i.placed_seq
    )


def _with_decisions(state: State, decisions: Sequence[LogEvent]) -> State:
    """`state` as it will be once `decisions` are folded (the shell folds them before it decides
    on anything newer; this lets one decision see the ones taken just before it). Each is folded
    as the master's, which it is, whatever name this master's stamper gives."""
    for event in decisions:
        as_master = msgspec.structs.replace(event.env, origin=Origin(service=MASTER))
        state = apply(state, state.last_seq + 1, msgspec.structs.replace(event, env=as_master))
    return state


def judge_instance(state: State, instance: InstanceInfo) -> Culprit | None:
    """Who broke `instance`, from the log alone: a node gone, a rank down (the watchdog adds what
    the heartbeats say). Judged as of the last status a rank reported."""
    reported_at = max(r.changed_at for r in instance.runners)
    return name_culprit(Evidence.about_instance(state, instance, {}, reported_at, STALLED_TASK_BOUNDS))


def _runner_failure(instance: InstanceInfo, culprit: Culprit | None) -> str:
    blamed = [instance.runners[rank] for rank in culprit.ranks] if culprit else []
    for runner in [*blamed, *instance.runners]:
        if runner.down:
            detail = f": {detail_headline(runner.detail)}" if runner.detail else ""  # a client reads it
            return f"rank {runner.rank} on node {runner.node_id} {runner.status}{detail}"
    return "a runner failed"


def _broken(state: State, instance: InstanceInfo) -> tuple[str, RetireCause] | None:
    """Why `instance` cannot serve, if it cannot. A node gone comes first: a worker that shut down
    also takes its runners down (a rank loading may even report the interrupted ring accept as an
    error), and that is a stop, not a failure of the model (`placement_failures`)."""
    for shard in instance.shards:
        node = state.nodes.get(shard.node_id)
        if node is None or node.status != "up":
            status = node.status if node is not None else "unknown"
            # why it left (a revoked node says so); a timeout's reason is a raw clock reading
            why = f" ({node.reason})" if node is not None and node.status == "left" and node.reason else ""
            return f"node {shard.node_id} (rank {shard.rank}) is {status.replace('_', ' ')}{why}", "node_gone"
    if instance.failed:
        return _runner_failure(instance, judge_instance(state, instance)), "runner_down"
    return None
