"""Which models the master keeps placed, and which instances it may let go. Pure queries over the
State; the core turns them into decisions.

- A model is *kept placed* without a request when it is configured (`models`) or an operator
  loaded it (`ModelLoadRequested`), unless it was unloaded since: by an operator, for idleness or
  to make room. A request for it (a task) places it again; a pinned model is never let go.
- An instance is *idle* when it is ready, holds no task, and no task waits for its model.
- Idle instances of unpinned models are retired after the keep-alive (`idle_to_unload`, by the
  master's own monotonic clock: no other host's clock is read), and evicted, least recently used
  first (by the log's order: `InstanceInfo.last_busy_seq`), when another model needs their memory.
- An operator's unload retires the model's instances as soon as each holds no task: a running
  stream is never cut (`unload_drained`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from events.ids import InstanceId
from events.retention import live_tasks_of
from events.state import InstanceInfo, State

# Retirements after which a configured model waits for a request before it is placed again.
LET_GO: frozenset[str] = frozenset({"idle", "evicted", "unloaded"})


def waiting_models(state: State) -> set[str]:
    """Models with a task that waits for an instance (not assigned, not ended, not cancelled)."""
    return {t.model for t in live_tasks_of(state) if t.instance_id is None and t.cancel_reason is None}


def pinned(state: State, model: str) -> bool:
    status = state.models.get(model)
    return status is not None and status.pinned


def draining(state: State, instance: InstanceInfo) -> bool:
    """It takes no new task: an operator unloaded its model after it was placed, or an instance
    that replaces it is ready."""
    return unloaded_since_placed(state, instance) or taken_over(state, instance)


def unloaded_since_placed(state: State, instance: InstanceInfo) -> bool:
    status = state.models.get(instance.model)
    return status is not None and status.unloaded and instance.placed_seq < status.unload_requested_seq


def taken_over(state: State, instance: InstanceInfo) -> bool:
    """A ready instance replaces it (`InstancePlaced.replaces`)."""
    return any(i.replaces == instance.instance_id and i.ready for i in state.instances.values())


def moving(state: State) -> bool:
    """A replacement is on its way (placed, not ready yet): one move at a time."""
    return any(i.replaces is not None and not i.retired and not i.ready for i in state.instances.values())


def wanted_placed(state: State, configured: Sequence[str]) -> list[str]:
    """The models to keep placed now, whether or not a task waits for them, in configured order
    then the operator's."""
    wanted: list[str] = []
    for model in dict.fromkeys([*configured, *operator_loaded(state)]):
        status = state.models.get(model)
        if status is not None and status.unloaded:
            continue
        newest = _newest_instance(state, model)
        let_go = newest is not None and newest.retired and newest.retire_cause in LET_GO
        asked_since = status is not None and newest is not None and status.load_requested_seq > newest.placed_seq
        if not let_go or pinned(state, model) or asked_since:
            wanted.append(model)
    return wanted


def operator_wants(state: State, model: str) -> bool:
    """An operator asked for `model` (pinned it, or loaded it since its newest placement)."""
    status = state.models.get(model)
    if status is None or not status.load_requested_seq or status.unloaded:
        return False
    newest = _newest_instance(state, model)
    return status.pinned or newest is None or status.load_requested_seq > newest.placed_seq


def idle_instances(state: State) -> list[InstanceInfo]:
    """Live, ready instances of unpinned models that hold no task while none waits for their model,
    least recently used first."""
    waiting = waiting_models(state)
    idle = [
        i
        for i in state.instances.values()
        if i.ready and not i.queue and i.model not in waiting and not pinned(state, i.model)
    ]
    return sorted(idle, key=lambda i: (i.last_busy_seq, i.placed_seq))


def evictable(state: State, *, for_model: str) -> list[InstanceInfo]:
    """The idle instances another model may take the memory of, least recently used first."""
    return [i for i in idle_instances(state) if i.model != for_model]


def idle_to_unload(
    state: State, idle_seconds: Mapping[InstanceId, float], keep_alive_seconds: float
) -> list[InstanceInfo]:
    """Idle instances idle for at least their keep-alive (the last request's `keep_alive` on it,
    else `keep_alive_seconds`; negative: never), as the master's clock measured it (`idle_seconds`:
    since it last saw each one holding a task or placed)."""
    due: list[InstanceInfo] = []
    for instance in idle_instances(state):
        keep_alive = keep_alive_of(instance, keep_alive_seconds)
        if keep_alive >= 0 and idle_seconds.get(instance.instance_id, 0.0) >= keep_alive:
            due.append(instance)
    return due


def keep_alive_of(instance: InstanceInfo, default_seconds: float) -> float:
    return instance.keep_alive_seconds if instance.keep_alive_seconds is not None else default_seconds


def unload_drained(state: State) -> list[InstanceInfo]:
    """Draining instances (see `draining`) that hold no task any more."""
    return [i for i in state.instances.values() if not i.retired and not i.queue and draining(state, i)]


def operator_loaded(state: State) -> list[str]:
    """The models an operator asked to load, in name order."""
    return sorted(m for m, status in state.models.items() if status.load_requested_seq)


def _newest_instance(state: State, model: str) -> InstanceInfo | None:
    instances = [i for i in state.instances.values() if i.model == model]
    return max(instances, key=lambda i: i.placed_seq, default=None)


def instance_ids(instances: Collection[InstanceInfo]) -> set[InstanceId]:
    return {i.instance_id for i in instances}


class IdleClock:
    """How long each idle instance has been idle, by the master's own monotonic clock: since the
    first tick that saw it idle, restarted whenever a task came or went on it in between (its
    `last_busy_seq` moved), so a task served between two ticks counts as activity. A master that
    starts (or takes over) counts from its start: it may unload later than the keep-alive, never
    sooner."""

    def __init__(self) -> None:
        self._since: dict[InstanceId, tuple[int, float]] = {}  # instance -> (last_busy_seq, idle since)

    def observe(self, state: State, now: float) -> dict[InstanceId, float]:
        since: dict[InstanceId, tuple[int, float]] = {}
        for instance in idle_instances(state):
            busy_seq, at = self._since.get(instance.instance_id, (instance.last_busy_seq, now))
            since[instance.instance_id] = (instance.last_busy_seq, at if busy_seq == instance.last_busy_seq else now)
        self._since = since
        return {instance_id: now - at for instance_id, (_busy, at) in since.items()}


def replica_candidates(
    state: State, waited_seconds: Mapping[str, float], after_seconds: float, max_instances: int
) -> list[str]:
    """Models whose tasks have waited for a place for `after_seconds` or more (by the master's
    clock, `WaitClock`) while every instance of theirs is ready and full, with fewer than
    `max_instances` live: another instance would serve them sooner."""
    models: list[str] = []
    for model, waited in sorted(waited_seconds.items()):
        live = [i for i in state.instances.values() if i.model == model and not i.retired]
        if waited >= after_seconds and 0 < len(live) < max_instances and all(i.ready for i in live):
            models.append(model)
    return models


class WaitClock:
    """How long each model has had tasks waiting at the master while it has a ready instance (its
    places are all taken), by the master's own monotonic clock: since the first tick that saw it
    so; a tick that sees none waiting starts it again."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def observe(self, state: State, now: float) -> dict[str, float]:
        ready_models = {i.model for i in state.instances.values() if i.ready}
        waiting = waiting_models(state) & ready_models
        self._since = {model: self._since.get(model, now) for model in waiting}
        return {model: now - since for model, since in self._since.items()}
