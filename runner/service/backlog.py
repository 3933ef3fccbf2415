"""Which of a runner's events wait for the log, and which task fails when too many wait.

A runner that cannot publish (NATS down, partitioned, paused) keeps its events, in order, and
its bridge keeps resending the oldest with its own event id (JetStream's de-duplication makes a
resend of a stored event harmless) until the log takes it. That holds for an outage of any
length, up to `limit` events waiting. Past it the runner gives up *loudly*, one task at a time:

- an event of a task that finds the backlog full is not kept; in its place the backlog admits
  (over the limit, once per task) a `TaskFailed` that says the runner could not publish;
- from then on every event of that task is dropped, its `TaskCompleted` included, so the log
  never shows a task complete with text missing; the bridge also stops the task (as a cancel);
- a task-less event that finds it full is dropped (progress of a download), except a runner's
  status change, which the master needs and of which a rank makes a few per task.

Invariant: the events of one task that reach the log are a prefix of what the runner made,
followed at most by the backlog's `TaskFailed`; nothing is dropped while fewer than `limit` wait.

Pure (no I/O, no lock): the bridge calls it under its own lock from the threads that publish.
"""

from __future__ import annotations

from collections.abc import Callable

from events.catalogue import LogEvent, RunnerStatusChanged, TaskFailed
from events.ids import EventId, TaskId

FailTask = Callable[[TaskId, str], TaskFailed]


def task_of(event: LogEvent) -> TaskId | None:
    """The task an event belongs to, if any (every task event names it as `task_id`)."""
    task_id: TaskId | None = getattr(event, "task_id", None)
    return task_id


class PublishBacklog:
    """Counts the log events admitted and not yet stored, and decides what a new one becomes."""

    def __init__(self, limit: int, fail_task: FailTask) -> None:
        self.limit = limit
        self.waiting = 0  # admitted, not yet stored (or refused) by the log
        self.lost: dict[TaskId, EventId] = {}  # tasks failed by the backlog -> their TaskFailed's id
        self.cut: set[TaskId] = set()  # lost tasks whose events already queued must not go either
        self.dropped = 0  # events not kept, ever (for the log line that says so)
        self._fail_task = fail_task

    def admit(self, event: LogEvent) -> list[LogEvent]:
        """What to queue for `event`: itself, a `TaskFailed` in its place, or nothing."""
        task_id = task_of(event)
        if task_id is not None and task_id in self.lost:
            self.dropped += 1
            return []
        if self.waiting < self.limit or (task_id is None and isinstance(event, RunnerStatusChanged)):
            self.waiting += 1
            return [event]
        self.dropped += 1
        if task_id is None:
            return []
        reason = f"{self.waiting} events were waiting for the log (publish_backlog_events = {self.limit})"
        return [self.give_up(task_id, reason)]

    def give_up(self, task_id: TaskId, reason: str, *, cut_queued: bool = False) -> TaskFailed:
        """Mark `task_id` lost and count its `TaskFailed` as waiting (it is queued over the limit).

        `cut_queued`: the log refused one of its events, so those queued behind it follow a hole
        and are not sent either; when the backlog is full, those queued are a whole prefix."""
        failed = self._fail_task(task_id, f"the runner could not publish the task's events: {reason}")
        self.lost[task_id] = failed.env.event_id
        if cut_queued:
            self.cut.add(task_id)
        self.waiting += 1
        return failed

    def still_wanted(self, event: LogEvent) -> bool:
        """Whether a queued event should still go out: not when an earlier event of its task was
        refused (`give_up(cut_queued=True)`), unless it is the task's failure itself."""
        task_id = task_of(event)
        return task_id is None or task_id not in self.cut or self.lost[task_id] == event.env.event_id

    def stored(self, made: int = 1) -> None:
        """An admitted event left the backlog (stored, or refused and accounted for); `made`: how
        many admitted events it stood for (chunks coalesced into one, `runner.service.coalesce`),
        so the limit counts the events the runner made, however they were merged."""
        self.waiting -= made
