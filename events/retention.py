"""Which tasks the State holds: the live-task index and the retention of ended tasks.

Without a bound every service would hold every task the log ever saw (prompt, stop strings,
output), so memory and start-up would grow with history. Instead:
- `State.live_tasks` indexes the tasks not yet ended, so the master's periodic work walks only
  those (`live_tasks_of`);
- an ended task joins `State.finished`, a queue in the order tasks ended; once more than `kept`
  are queued whole, the oldest leaves `State.tasks` and becomes a tombstone (its id only), and
  once more than `kept` tombstones are held, the oldest is forgotten.
The log keeps every event, so a reader wanting an evicted task reads it back from there
(`services.ops.task_history`). Every step is decided by the order of the log's events, never a
clock, so replicas folding the same log (fold, `Folder`, `apply_live`, a snapshot plus its tail)
hold identical States.

A late event about a tombstoned task (a slow rank's chunk after the watchdog failed the task, a
second terminal event) is the same harmless race as one about a task that ended a moment ago:
`late_about_evicted` says so and `apply` only advances the seq. An event about a task forgotten
even as a tombstone is quarantined as `UnknownTask` — it would have to arrive after `kept` more
tasks ended, which a real race cannot.
"""

from __future__ import annotations

import immutables
import msgspec

from events.catalogue import (
    ChunkGenerated,
    LogEvent,
    PrefillProgress,
    PrefillStarted,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskFailed,
    TaskStalled,
)
from events.ids import TaskId
from events.state import FinishedTasks, State, TaskInfo

replace = msgspec.structs.replace


def task_started(state: State, task: TaskInfo) -> State:
    """`state` with `task` (just created) in the live index."""
    return replace(state, live_tasks=state.live_tasks.set(task.task_id, task.created_seq))


def task_ended(state: State, task_id: TaskId) -> State:
    """`state` with `task_id` (just ended) out of the live index and into the finished queue,
    evicting the oldest ended tasks beyond the bound."""
    live = state.live_tasks.delete(task_id) if task_id in state.live_tasks else state.live_tasks
    finished = state.finished
    if finished.kept == 0:
        return replace(state, live_tasks=live)
    queued = replace(finished, order=finished.order.set(finished.next, task_id), next=finished.next + 1)
    return _retain(replace(state, live_tasks=live, finished=queued))


def _retain(state: State) -> State:
    """Evict whole tasks beyond `kept`, then forget tombstones beyond `kept`."""
    finished = state.finished
    tasks = state.tasks.mutate()
    order = finished.order.mutate()
    evicted = finished.evicted.mutate()
    first, kept_from = finished.first, finished.kept_from
    while finished.next - kept_from > finished.kept:
        task_id = order[kept_from]
        if task_id in tasks:
            del tasks[task_id]
        evicted[task_id] = kept_from
        kept_from += 1
    while kept_from - first > finished.kept:
        task_id = order[first]
        del order[first]
        if evicted.get(task_id) == first:
            del evicted[task_id]
        first += 1
    bounded = replace(finished, order=order.finish(), evicted=evicted.finish(), first=first, kept_from=kept_from)
    return replace(state, tasks=tasks.finish(), finished=bounded)


def with_finished_kept(state: State, kept: int) -> State:
    """`state` under another bound (a snapshot written by a service configured differently): the
    queue is rebuilt from the State itself — tombstones first, then ended tasks by `ended_seq` —
    so the result depends only on (`state`, `kept`)."""
    if kept == state.finished.kept:
        return state
    if kept == 0:
        return replace(state, finished=FinishedTasks(kept=0))
    tombstones = sorted(state.finished.evicted.items(), key=lambda item: item[1])
    ended = sorted((t for t in state.tasks.values() if t.ended), key=lambda t: t.ended_seq)
    queue = [task_id for task_id, _ordinal in tombstones] + [t.task_id for t in ended]
    finished = FinishedTasks(
        kept=kept,
        order=immutables.Map(enumerate(queue)),
        evicted=immutables.Map({task_id: ordinal for ordinal, (task_id, _old) in enumerate(tombstones)}),
        kept_from=len(tombstones),
        next=len(queue),
    )
    return _retain(replace(state, finished=finished))


def is_evicted(state: State, task_id: TaskId) -> bool:
    """The task ended and its payload left the State (a tombstone remembers it)."""
    return task_id in state.finished.evicted


def late_about_evicted(state: State, event: LogEvent) -> bool:
    """`event` is about a task whose payload left the State: a late race, folded as a no-op."""
    match event:
        case (
            PrefillProgress()
            | ChunkGenerated()
            | PrefillStarted()
            | TaskAssigned()
            | TaskCancelled()
            | TaskCompleted()
            | TaskFailed()
            | TaskStalled()
        ):
            return event.task_id in state.finished.evicted
        case _:
            return False


def live_tasks_of(state: State) -> list[TaskInfo]:
    """The tasks not yet ended, oldest first: what the master's per-tick work walks."""
    ordered = sorted(state.live_tasks.items(), key=lambda item: item[1])
    return [state.tasks[task_id] for task_id, _created_seq in ordered]
