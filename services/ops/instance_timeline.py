"""The timeline of one instance: one lane per rank, the tasks it ran as bars over time.

Under continuous batching an instance runs many tasks at once, and a task's own timeline shows
only one of them. This view shows the batch: on each rank, a bar per task from when the rank
began it (its `PrefillStarted`, else its first progress) to the task's end (or the log's newest
event while it runs), its prefill part apart; overlapping bars take separate rows of the lane,
so the rows in use at a moment are the batch then. Heartbeats mark where each rank last was and
where the flight recorder first saw it stuck, as on the task's timeline.

Times are milliseconds after the instance was placed (wall clocks: the only clock shared by the
processes of different ranks). Pure: feed it `(seq, event)` pairs of both streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from events.catalogue import (
    AnyEvent,
    ChunkGenerated,
    InstancePlaced,
    InstanceRetired,
    PrefillProgress,
    PrefillStarted,
    RunnerHeartbeat,
    RunnerStatusChanged,
    TaskAssigned,
    TaskCompleted,
    TaskFailed,
)
from events.ids import InstanceId, TaskId
from services.ops.timeline import EventWindow, HeartbeatMark, Marker, beat_mark

RUNNING = 2**63  # a running task's row is never free again


class TaskBar(msgspec.Struct, frozen=True, kw_only=True):
    task_id: TaskId
    row: int  # within the lane: tasks that overlap in time take different rows
    start_ms: float
    prefill_done_ms: float | None  # None: the rank had not finished its prefill
    end_ms: float
    status: str  # running | completed | cancelled | failed
    tokens: int  # generated so far


class InstanceLane(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    bars: tuple[TaskBar, ...] = ()
    rows: int = 0
    last_heartbeat: HeartbeatMark | None = None
    batch: tuple[TaskId, ...] = ()  # the tasks its newest heartbeat named
    kv: tuple[int, int] | None = None  # its newest heartbeat's batch KV positions: reserved, held by the instance
    first_stack: HeartbeatMark | None = None


class InstanceTimeline(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: InstanceId
    model: str = ""
    placed_wall_ns: int = 0
    end_ms: float = 0.0
    tasks: int = 0
    most_at_once: int = 0  # the largest number of tasks any rank ran at one moment
    lanes: tuple[InstanceLane, ...] = ()
    markers: tuple[Marker, ...] = ()


class _Run:
    """One task on one rank, as its events come."""

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.prefill_done_ns: int | None = None


class InstanceTimelineBuilder(EventWindow):
    """Feed it `(seq, event)` pairs (any: those of other instances are ignored), then `build()`.

    `tasks`: tasks known to be on the instance although their `TaskAssigned` may not be among the
    events fed (a window of a long log: the caller knows them from the State)."""

    def __init__(self, instance_id: InstanceId, tasks: Iterable[TaskId] = ()) -> None:
        super().__init__()
        self.instance_id = instance_id
        self._model = ""
        self._ranks: set[int] = set()
        self._tasks: set[TaskId] = set(tasks)
        self._runs: dict[tuple[TaskId, int], _Run] = {}
        self._ended: dict[TaskId, tuple[int, str]] = {}
        self._tokens: dict[TaskId, int] = {}
        self._beats: dict[int, RunnerHeartbeat] = {}
        self._first_stacks: dict[int, RunnerHeartbeat] = {}

    def _takes(self, event: AnyEvent) -> bool:
        if isinstance(event, TaskAssigned) and event.instance_id == self.instance_id:
            self._tasks.add(event.task_id)
            return True
        instance_id = getattr(event, "instance_id", None)
        if instance_id is not None:
            return instance_id == self.instance_id
        return getattr(event, "task_id", None) in self._tasks

    def _dispatch(self, event: AnyEvent, at: int) -> None:
        match event:
            case PrefillStarted():
                self._runs.setdefault((event.task_id, event.rank), _Run(at))
                self._ranks.add(event.rank)
            case PrefillProgress():
                self._progress(event, at)
            case ChunkGenerated():
                self._tokens[event.task_id] = self._tokens.get(event.task_id, 0) + len(event.token_ids)
            case TaskCompleted():
                self._ended.setdefault(
                    event.task_id, (at, "cancelled" if event.finish_reason == "cancelled" else "completed")
                )
            case TaskFailed():
                self._ended.setdefault(event.task_id, (at, "failed"))
            case RunnerHeartbeat():
                self._heartbeat(event)
            case InstancePlaced():
                self._origin_ns, self._model = at, event.model
                self._ranks.update(shard.rank for shard in event.shards)
            case RunnerStatusChanged() if event.status == "failed":
                self._mark(at, "failed", f"rank {event.rank} failed: {event.detail}", event.rank)
            case InstanceRetired():
                self._mark(at, "stalled", f"retired ({event.cause}): {event.reason}")
            case _:
                pass

    def _progress(self, event: PrefillProgress, at: int) -> None:
        run = self._runs.setdefault((event.task_id, event.rank), _Run(at))
        self._ranks.add(event.rank)
        if event.processed >= event.total and run.prefill_done_ns is None:
            run.prefill_done_ns = at

    def _heartbeat(self, beat: RunnerHeartbeat) -> None:
        self._ranks.add(beat.rank)
        previous = self._beats.get(beat.rank)
        if previous is None or previous.env.wall_time <= beat.env.wall_time:
            self._beats[beat.rank] = beat
        if beat.stack is not None and beat.rank not in self._first_stacks:
            self._first_stacks[beat.rank] = beat
            text = f"flight recorder: stuck in {beat.phase} (batch {', '.join(beat.tasks) or 'empty'})"
            self._mark(beat.env.wall_time, "stack", text, beat.rank)

    def build(self) -> InstanceTimeline:
        lanes = tuple(self._lane(rank, self._ms) for rank in sorted(self._ranks))
        return InstanceTimeline(
            instance_id=self.instance_id,
            model=self._model,
            placed_wall_ns=self._origin_ns or 0,
            end_ms=self._end_ms(),
            tasks=len({task_id for task_id, _rank in self._runs}),
            most_at_once=max((lane.rows for lane in lanes), default=0),
            lanes=lanes,
            markers=self._frozen_markers(),
        )

    def _lane(self, rank: int, ms: Callable[[int], float]) -> InstanceLane:
        runs = sorted(
            ((task_id, run) for (task_id, r), run in self._runs.items() if r == rank), key=lambda item: item[1].start_ns
        )
        row_ends: list[int] = []  # per row, when its last bar ends
        bars: list[TaskBar] = []
        for task_id, run in runs:
            end_ns, status = self._ended.get(task_id, (self._newest_ns, "running"))
            row = next((i for i, free_at in enumerate(row_ends) if free_at <= run.start_ns), len(row_ends))
            row_ends[row : row + 1] = [end_ns if status != "running" else RUNNING]
            done = run.prefill_done_ns
            bars.append(
                TaskBar(
                    task_id=task_id,
                    row=row,
                    start_ms=ms(run.start_ns),
                    prefill_done_ms=ms(done) if done is not None else None,
                    end_ms=ms(max(end_ns, run.start_ns)),
                    status=status,
                    tokens=self._tokens.get(task_id, 0),
                )
            )
        beat = self._beats.get(rank)
        return InstanceLane(
            rank=rank,
            bars=tuple(bars),
            rows=len(row_ends),
            last_heartbeat=beat_mark(beat, ms),
            batch=beat.tasks if beat is not None else (),
            kv=_kv_of(beat),
            first_stack=beat_mark(self._first_stacks.get(rank), ms),
        )


def _kv_of(beat: RunnerHeartbeat | None) -> tuple[int, int] | None:
    if beat is None or beat.kv_reserved_tokens is None or beat.kv_capacity_tokens is None:
        return None
    return beat.kv_reserved_tokens, beat.kv_capacity_tokens


def build_instance_timeline(
    instance_id: str, events: Iterable[tuple[int, AnyEvent]], tasks: Iterable[TaskId] = ()
) -> InstanceTimeline:
    builder = InstanceTimelineBuilder(InstanceId(instance_id), tasks)
    for seq, event in events:
        builder.observe(seq, event)
    return builder.build()
