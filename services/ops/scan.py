"""One pass over a log: fold the State, index heartbeats, feed optional observers.

`diagnose` and `replay` both need the same pass, and it must stay cheap on a million events:
the State is folded once (apply is O(log n) per event) and, of the telemetry stream, only the
newest heartbeat per (instance, rank) and per (task, rank) is kept — never the whole log.

Records may come from an export file (`ExportReader`, with line numbers) or from JetStream
(`LiveSource`, numbered by position); a record that cannot be folded (a sequence gap, an
unknown id) ends the pass at that point and is reported, like a corrupt line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import msgspec

from events.apply import ApplyError
from events.catalogue import AnyEvent, ClusterStarted, MasterProbe, NodeHeartbeat, RunnerHeartbeat
from events.codec import ExportRecord
from events.fold import Folder
from events.ids import InstanceId, TaskId
from events.state import State
from events.vocabulary import StreamKey
from services.ops.load import SkippedLines
from services.ops.runs import RunStart

_TELEMETRY_TYPES = frozenset((RunnerHeartbeat, NodeHeartbeat, MasterProbe))  # exact types: none is subclassed


class Cutoff(msgspec.Struct, frozen=True, kw_only=True):
    """Where `--at` stops the fold: after event sequence `seq`, or at wall time `wall_ns`."""

    seq: int | None = None
    wall_ns: int | None = None

    def excludes(self, stream: StreamKey, seq: int, wall_ns: int) -> bool:
        if self.wall_ns is not None and wall_ns > self.wall_ns:
            return True
        return stream == "events" and self.seq is not None and seq > self.seq


class HeartbeatIndex:
    """The newest heartbeat of each rank, and of each rank about each task; and, with the newest
    about a task, where each peer's own clock stood then (`peers_at`: the stamp of the peer's
    newest beat before it, in the telemetry stream's order), so a rank's silence can be told on
    its peers' clocks (`Heartbeats.silences`), and where in the stream each came (`positions`)."""

    def __init__(self) -> None:
        self.latest: dict[tuple[InstanceId, int], RunnerHeartbeat] = {}
        self.by_task: dict[tuple[TaskId, int], RunnerHeartbeat] = {}
        self.peers_at: dict[tuple[TaskId, int], dict[int, int]] = {}
        self.positions: dict[tuple[TaskId, int], int] = {}  # where in the stream each `by_task` beat came
        self._walls: dict[InstanceId, dict[int, int]] = {}  # each rank's newest stamp so far, in stream order
        self.count = 0

    def add(self, beat: RunnerHeartbeat) -> None:
        self.count += 1
        key = (beat.instance_id, beat.rank)
        wall = beat.env.wall_time
        walls = self._walls.setdefault(beat.instance_id, {})
        walls[beat.rank] = wall
        previous = self.latest.get(key)
        # Exports may interleave streams in any order: keep the newest by wall time, not by position.
        if previous is None or previous.env.wall_time <= wall:
            self.latest[key] = beat
        for task_id in beat.tasks:  # a batched rank's beat is about every task of its batch
            task_key = (task_id, beat.rank)
            previous = self.by_task.get(task_key)
            if previous is None or previous.env.wall_time <= wall:
                self.by_task[task_key] = beat
                self.peers_at[task_key] = {rank: at for rank, at in walls.items() if rank != beat.rank}
                self.positions[task_key] = self.count


class EventObserver(Protocol):
    def observe(self, seq: int, event: AnyEvent) -> None: ...


class Abandon(Protocol):
    def __call__(self, line: int, reason: str) -> None: ...


class ScanResult:
    """What one pass learned. Mutable while scanning; read it after `scan` returns."""

    def __init__(self) -> None:
        # Every task, never evicted (`events.retention`): a tool reads one log once, and its
        # operator may ask about any task in it.
        self.state = State.keeping(0)
        self.heartbeats = HeartbeatIndex()
        self.newest_wall_ns = 0
        self.events_folded = 0
        self.records_read = 0
        self.fold_error: SkippedLines | None = None
        self.runs: list[RunStart] = []  # each `shoal up` that started on this log, in order


def scan(
    records: Iterable[tuple[int, ExportRecord]],
    *,
    cutoff: Cutoff | None = None,
    observers: Iterable[EventObserver] = (),
    abandon: Abandon | None = None,
    allow_gaps: bool = False,
) -> ScanResult:
    """Fold `(line_or_position, record)` pairs. `abandon(line, reason)` is told where folding stopped.

    `allow_gaps`: a live stream legitimately skips a malformed message's seq; a file must not.
    """
    result = ScanResult()
    watchers = tuple(observers)
    add_heartbeat = result.heartbeats.add
    folder = Folder(result.state)
    add_event = folder.add
    last_seq = folder.last_seq  # the folder's, kept here: every fold that returns advances it to `seq`
    newest = read = folded = 0
    for line, record in records:  # hot loop: a million iterations, so kept flat and local
        event = record.event
        wall = event.env.wall_time
        if cutoff is not None and cutoff.excludes(record.stream, record.seq, wall):
            continue
        read += 1
        kind = type(event)
        if record.stream == "telemetry":
            if isinstance(event, RunnerHeartbeat):
                add_heartbeat(event)
        elif kind not in _TELEMETRY_TYPES:
            seq = record.seq
            if seq > last_seq + 1 and (allow_gaps or last_seq == 0):
                folder.skip_to(seq)  # trimmed head / skipped poison message
            try:
                refused = add_event(seq, event, record.subject)  # pyright: ignore[reportArgumentType]
            except ApplyError as exc:
                error = f"cannot fold event seq {seq}: {exc}"
                result.fold_error = SkippedLines(line=line, reason=error, lines_not_used=1)
                if abandon is not None:
                    abandon(line, error)
                break
            last_seq = seq
            folded += 1
            if kind is ClusterStarted and refused is None:  # a forged one starts no run
                result.runs.append(RunStart(seq=seq, wall_ns=wall))
        if wall > newest:
            newest = wall
        if watchers:
            for watcher in watchers:
                watcher.observe(record.seq, event)
    result.state, result.newest_wall_ns, result.records_read, result.events_folded = folder.state, newest, read, folded
    return result


def wall_time_of_seq(records: Iterable[tuple[int, ExportRecord]], seq: int) -> int | None:
    """The wall time of event `seq`, so `--at SEQ` can also cut the telemetry stream in time."""
    for _, record in records:
        if record.stream == "events" and record.seq == seq:
            return record.event.env.wall_time
    return None
