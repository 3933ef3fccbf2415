"""The timeline of one task, built from its events: what `replay --task` prints and the page draws.

Times are milliseconds after the task was created, from the events' wall clocks (the only clock
shared by the processes of different ranks).

Prefill bars: a `PrefillProgress` is published when a rank finishes a chunk, so a chunk's bar
ends at its event. It starts where the rank's previous event left off — except across idle
iterations (the GPipe leading/trailing bubbles, docs/ARCHITECTURE.md §6): when the iteration
number jumps by `k`, the elapsed time is split evenly and only the last share is drawn, so a
bubble shows as a gap, as it happened.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Literal

import msgspec

from events.catalogue import (
    AnyEvent,
    ChunkGenerated,
    PrefillProgress,
    PrefillStarted,
    RunnerHeartbeat,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
)
from events.ids import InstanceId, TaskId

MarkerKind = Literal["created", "assigned", "first_token", "cancel", "completed", "failed", "stalled", "stack"]
NS_PER_MS = 1_000_000


class PrefillBar(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    iteration: int
    chunk: int  # 0-based, in the order the rank finished them
    start_ms: float
    end_ms: float
    processed: int
    total: int


class HeartbeatMark(msgspec.Struct, frozen=True, kw_only=True):
    at_ms: float
    phase: str
    iteration: int
    phase_age_ms: int
    stack: str | None


class RankLane(msgspec.Struct, frozen=True, kw_only=True):
    rank: int
    path: str = ""
    prompt_tokens: int = 0
    chunks: int = 0
    step: int = 0
    started_ms: float | None = None
    done_ms: float | None = None  # the (total, total) callback: this rank finished prefill
    bars: tuple[PrefillBar, ...] = ()
    last_heartbeat: HeartbeatMark | None = None
    first_stack: HeartbeatMark | None = None  # when the flight recorder first saw this rank stuck


class DecodeSpan(msgspec.Struct, frozen=True, kw_only=True):
    start_ms: float
    end_ms: float
    chunks: int
    tokens: int


class Marker(msgspec.Struct, frozen=True, kw_only=True):
    at_ms: float
    kind: MarkerKind
    text: str
    rank: int | None = None


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    task_id: TaskId
    model: str = ""
    instance_id: InstanceId | None = None
    status: str = "unknown"
    created_wall_ns: int = 0
    end_ms: float = 0.0  # the newest event seen about this task
    lanes: tuple[RankLane, ...] = ()
    decode: DecodeSpan | None = None
    markers: tuple[Marker, ...] = ()


class _Lane:
    """Mutable per-rank accumulator; frozen into a `RankLane` by `build`."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.started: PrefillStarted | None = None
        self.last_ns = 0
        self.last_iteration = -1
        self.done_ns: int | None = None
        self.bars: list[tuple[int, int, int, int, int]] = []  # iteration, start, end, processed, total
        self.last_beat: RunnerHeartbeat | None = None
        self.first_stack: RunnerHeartbeat | None = None


class EventWindow(ABC):
    """What every timeline builder keeps: whether it saw anything, its origin (the first event it
    took, or a later one it names the origin) and its newest event, and its markers; times are
    made milliseconds after the origin. Subclasses say which events are theirs and what each does."""

    def __init__(self) -> None:
        self.seen = False
        self._origin_ns: int | None = None
        self._newest_ns = 0
        self._markers: list[tuple[int, MarkerKind, str, int | None]] = []

    def observe(self, seq: int, event: AnyEvent) -> None:
        if not self._takes(event):
            return
        self.seen = True
        at = event.env.wall_time
        if self._origin_ns is None:
            self._origin_ns = at
        self._newest_ns = max(self._newest_ns, at)
        self._dispatch(event, at)

    @abstractmethod
    def _takes(self, event: AnyEvent) -> bool:
        """Whether `event` belongs to this view."""

    @abstractmethod
    def _dispatch(self, event: AnyEvent, at: int) -> None:
        """Take one of its events, at wall time `at`."""

    def _mark(self, at: int, kind: MarkerKind, text: str, rank: int | None = None) -> None:
        self._markers.append((at, kind, text, rank))

    def _ms(self, ns: int) -> float:
        return round((ns - (self._origin_ns or 0)) / NS_PER_MS, 3)

    def _frozen_markers(self) -> tuple[Marker, ...]:
        ordered = sorted(self._markers, key=lambda m: m[0])
        return tuple(Marker(at_ms=self._ms(at), kind=kind, text=text, rank=rank) for at, kind, text, rank in ordered)

    def _end_ms(self) -> float:
        return self._ms(self._newest_ns) if self.seen else 0.0


class TimelineBuilder(EventWindow):
    """Feed it `(seq, event)` pairs (any events: those of other tasks are ignored), then `build()`."""

    def __init__(self, task_id: TaskId) -> None:
        super().__init__()
        self.task_id = task_id
        self._model = ""
        self._instance: InstanceId | None = None
        self._status = "unknown"
        self._lanes: dict[int, _Lane] = {}
        self._decode: list[int] = [0, 0, 0, 0]  # first ns, last ns, chunks, tokens

    def _takes(self, event: AnyEvent) -> bool:
        """The task's own events, and the heartbeats of a rank running it (alone or in a batch)."""
        if isinstance(event, RunnerHeartbeat):
            return self.task_id in event.tasks
        return getattr(event, "task_id", None) == self.task_id

    def _lane(self, rank: int) -> _Lane:
        lane = self._lanes.get(rank)
        if lane is None:
            lane = self._lanes[rank] = _Lane(rank)
        return lane

    def _dispatch(self, event: AnyEvent, at: int) -> None:
        match event:
            case PrefillProgress():
                self._progress(event, at)
            case ChunkGenerated():
                self._chunk(event, at)
            case RunnerHeartbeat():
                self._heartbeat(event)
            case PrefillStarted():
                lane = self._lane(event.rank)
                lane.started, lane.last_ns = event, at
                self._status = "prefilling"
            case TaskCreated():
                self._origin_ns, self._model, self._status = at, event.model, "created"
                self._mark(at, "created", f"created (model {event.model})")
            case TaskAssigned():
                self._instance, self._status = event.instance_id, "assigned"
                self._mark(at, "assigned", f"assigned to {event.instance_id}")
            case TaskCancelled():
                self._mark(at, "cancel", f"cancel requested ({event.reason})")
            case TaskCompleted():
                self._status = "cancelled" if event.finish_reason == "cancelled" else "completed"
                self._mark(
                    at, "completed", f"completed ({event.finish_reason}, {event.usage.completion_tokens} tokens)"
                )
            case TaskFailed():
                self._status = "failed"
                where = f" on rank {event.rank}" if event.rank is not None else ""
                self._mark(at, "failed", f"failed{where}: {event.error}", event.rank)
            case TaskStalled():
                self._mark(at, "stalled", f"watchdog: {event.diagnosis}")
            case _:
                pass

    def _progress(self, event: PrefillProgress, at: int) -> None:
        lane = self._lane(event.rank)
        if event.processed == 0:
            lane.last_ns = at  # the (0, total) callback: prefill begins; its iteration is not a chunk's
            return
        if event.processed >= event.total:
            lane.done_ns = at
            return
        steps = max(1, event.iteration - lane.last_iteration)
        start = at - (at - lane.last_ns) // steps if lane.last_ns else at
        lane.bars.append((event.iteration, start, at, event.processed, event.total))
        lane.last_ns, lane.last_iteration = at, event.iteration

    def _chunk(self, event: ChunkGenerated, at: int) -> None:
        decode = self._decode
        if decode[2] == 0:
            decode[0] = at
            self._mark(at, "first_token", "first token")
        decode[1] = at
        decode[2] += 1
        decode[3] += len(event.token_ids)
        if self._status in ("created", "assigned", "prefilling", "unknown"):
            self._status = "decoding"

    def _heartbeat(self, beat: RunnerHeartbeat) -> None:
        lane = self._lane(beat.rank)
        lane.last_beat = beat
        if beat.stack is not None and lane.first_stack is None:
            lane.first_stack = beat
            text = f"flight recorder: stuck in {beat.phase} (iteration {beat.iteration})"
            self._mark(beat.env.wall_time, "stack", text, beat.rank)

    def build(self) -> Timeline:
        ms = self._ms
        lanes = tuple(_freeze_lane(self._lanes[rank], ms) for rank in sorted(self._lanes))
        first, last, chunks, tokens = self._decode
        decode = DecodeSpan(start_ms=ms(first), end_ms=ms(last), chunks=chunks, tokens=tokens) if chunks else None
        return Timeline(
            task_id=self.task_id,
            model=self._model,
            instance_id=self._instance,
            status=self._status,
            created_wall_ns=self._origin_ns or 0,
            end_ms=self._end_ms(),
            lanes=lanes,
            decode=decode,
            markers=self._frozen_markers(),
        )


def beat_mark(beat: RunnerHeartbeat | None, ms: Callable[[int], float]) -> HeartbeatMark | None:
    if beat is None:
        return None
    return HeartbeatMark(
        at_ms=ms(beat.env.wall_time),
        phase=beat.phase,
        iteration=beat.iteration,
        phase_age_ms=beat.phase_age_ms,
        stack=beat.stack,
    )


def _freeze_lane(lane: _Lane, ms: Callable[[int], float]) -> RankLane:
    bars = tuple(
        PrefillBar(rank=lane.rank, iteration=it, chunk=i, start_ms=ms(s), end_ms=ms(e), processed=p, total=t)
        for i, (it, s, e, p, t) in enumerate(lane.bars)
    )
    started = lane.started
    return RankLane(
        rank=lane.rank,
        path=started.path if started else "",
        prompt_tokens=started.prompt_tokens if started else 0,
        chunks=started.chunks if started else 0,
        step=started.step if started else 0,
        started_ms=ms(started.env.wall_time) if started else None,
        done_ms=ms(lane.done_ns) if lane.done_ns is not None else None,
        bars=bars,
        last_heartbeat=beat_mark(lane.last_beat, ms),
        first_stack=beat_mark(lane.first_stack, ms),
    )


def build_timeline(task_id: str, events: Iterable[tuple[int, AnyEvent]]) -> Timeline:
    """The timeline of `task_id` from any `(seq, event)` pairs (the API passes the task's subjects)."""
    builder = TimelineBuilder(TaskId(task_id))
    for seq, event in events:
        builder.observe(seq, event)
    return builder.build()
