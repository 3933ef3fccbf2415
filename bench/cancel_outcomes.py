"""What the log says each cancel did (pure: fed the events of a `shoal bench cancel` run).

For each task the bench cancelled, from the log alone:
- the latency: `TaskCancelled` to the moment every rank let the task go. A batching runner (the
  default: `max_batch` > 1) keeps serving the batch's other streams, so no rank goes idle for one
  task: its streams leave at the step whose all-reduce agreed the cancel vote, on every rank at
  once, and the sampling rank's `TaskCompleted(cancelled)` is that step (the other ranks leave
  within that step). A runner that serves one task at a time reports each rank idle for it
  (`RunnerStatusChanged(ready, detail=task)`); when every rank did, the last report is the moment.
  (The bench read only the idle reports, which batching runners never send for a task, so since
  batching every cancel read as a hang.)
- where it landed: in prefill when no rank had finished the prompt (no `PrefillProgress` with
  processed == total, the report the first decode step makes), in decode otherwise; a cancel
  that came after the task had already ended is `missed`, not a cancel;
- a hang: the task was cancelled but not let go within the deadline (a rank that reported idle
  while another never did is a hang, never dropped), or the task failed instead.
Also the cadence the targets are judged against: the time between one rank's prefill chunks
and between decode tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from events.catalogue import (
    ChunkGenerated,
    LogEvent,
    PrefillProgress,
    RunnerStatusChanged,
    TaskCancelled,
    TaskCompleted,
    TaskFailed,
)

Landed = Literal["prefill", "decode", "missed", "hang"]
NS_PER_MS = 1_000_000


@dataclass(slots=True)
class _Task:
    cancelled_ns: int | None = None
    idle_ns: dict[int, int] = field(default_factory=dict)
    ended: str | None = None  # finish reason, or "failed"
    ended_ns: int | None = None
    prompt_done: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    task_id: str
    landed: Landed
    latency_ms: float | None  # TaskCancelled -> every rank let it go; None for a hang or a miss


@dataclass(frozen=True, slots=True)
class Cadence:
    prefill_chunk_ms: list[float]  # gaps between one rank's consecutive prefill chunks
    decode_token_ms: list[float]  # gaps between consecutive token chunks, per token


def outcomes(events: Iterable[LogEvent], task_ids: Iterable[str], world: int, deadline_ms: float) -> list[Outcome]:
    tasks = _fold(events)
    return [_judge(task_id, tasks.get(task_id, _Task()), world, deadline_ms) for task_id in task_ids]


def _fold(events: Iterable[LogEvent]) -> dict[str, _Task]:
    tasks: dict[str, _Task] = {}
    for event in events:
        match event:
            case TaskCancelled():
                task = tasks.setdefault(event.task_id, _Task())
                task.cancelled_ns = task.cancelled_ns or event.env.wall_time
            case RunnerStatusChanged(status="ready", detail=task_id) if task_id:
                tasks.setdefault(task_id, _Task()).idle_ns.setdefault(event.rank, event.env.wall_time)
            case PrefillProgress() if event.total > 0 and event.processed >= event.total:
                tasks.setdefault(event.task_id, _Task()).prompt_done = True
            case TaskCompleted():
                task = tasks.setdefault(event.task_id, _Task())
                task.ended, task.ended_ns = event.finish_reason, event.env.wall_time
            case TaskFailed():
                tasks.setdefault(event.task_id, _Task()).ended = "failed"
            case _:
                pass
    return tasks


def _judge(task_id: str, task: _Task, world: int, deadline_ms: float) -> Outcome:
    if task.ended not in (None, "cancelled", "failed"):
        return Outcome(task_id, "missed", None)  # it finished before the cancel reached it
    let_go = _let_go_ns(task, world)
    if task.cancelled_ns is None or task.ended == "failed" or let_go is None:
        return Outcome(task_id, "hang", None)
    latency_ms = (let_go - task.cancelled_ns) / NS_PER_MS
    if latency_ms > deadline_ms:
        return Outcome(task_id, "hang", None)
    return Outcome(task_id, "decode" if task.prompt_done else "prefill", latency_ms)


def _let_go_ns(task: _Task, world: int) -> int | None:
    """When every rank let the task go: the last rank's idle report where every rank sent one (a
    runner serving one task at a time); else, with no rank's idle report, the task's cancelled end
    (a batch lets it go on every rank at one agreed step); None while neither is known."""
    if len(task.idle_ns) >= world:
        return max(task.idle_ns.values())
    if not task.idle_ns and task.ended == "cancelled":
        return task.ended_ns
    return None


def cadence(events: Iterable[LogEvent], rank: int) -> Cadence:
    """Prefill chunk gaps on `rank` (processed > 0) and decode gaps per token, over every task."""
    chunk_gaps: list[float] = []
    token_gaps: list[float] = []
    last_chunk: dict[str, int] = {}
    last_tokens: dict[str, int] = {}
    for event in events:
        match event:
            case PrefillProgress() if event.rank == rank and 0 < event.processed < event.total:
                if event.task_id in last_chunk:
                    chunk_gaps.append((event.env.wall_time - last_chunk[event.task_id]) / NS_PER_MS)
                last_chunk[event.task_id] = event.env.wall_time
            case ChunkGenerated() if event.token_ids:
                if event.task_id in last_tokens:
                    gap = (event.env.wall_time - last_tokens[event.task_id]) / NS_PER_MS
                    token_gaps.append(gap / len(event.token_ids))
                last_tokens[event.task_id] = event.env.wall_time
            case _:
                pass
    return Cadence(chunk_gaps, token_gaps)


def pending(events: Iterable[LogEvent], task_ids: Iterable[str], world: int) -> list[str]:
    """Cancelled tasks not let go yet (the bench waits for these): not ended, or reported idle by
    some ranks and not all."""
    tasks = _fold(events)
    return [
        t
        for t in task_ids
        if t in tasks and tasks[t].ended != "failed" and (tasks[t].ended is None or 0 < len(tasks[t].idle_ns) < world)
    ]
