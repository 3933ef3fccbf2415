"""The heartbeats a diagnosis reads, and where a rank's stack says it sits."""

from __future__ import annotations

from collections.abc import Mapping

from events.catalogue import RunnerHeartbeat
from events.evidence import NS
from events.ids import InstanceId, TaskId
from events.state import InstanceInfo, TaskInfo


class Heartbeats:
    """Read-only view of the newest heartbeats (see `scan.HeartbeatIndex`)."""

    def __init__(
        self,
        latest: Mapping[tuple[InstanceId, int], RunnerHeartbeat],
        by_task: Mapping[tuple[TaskId, int], RunnerHeartbeat],
        peers_at: Mapping[tuple[TaskId, int], Mapping[int, int]] | None = None,
        positions: Mapping[tuple[TaskId, int], int] | None = None,
    ) -> None:
        self.latest = latest
        self.by_task = by_task
        self.peers_at: Mapping[tuple[TaskId, int], Mapping[int, int]] = peers_at or {}
        self.positions: Mapping[tuple[TaskId, int], int] = positions or {}

    def silences(self, task: TaskInfo, instance: InstanceInfo) -> dict[int, float] | None:
        """How long each rank of an ended task had been silent about it when its peers last beat
        about it, in seconds: for each peer whose newest beat about it came later in the stream,
        from where the peer's own clock stood at the rank's newest beat to the peer's newest beat;
        the longest of them (0: no peer beat after it). Each span is read on one host's clock, so
        no skew between hosts enters it (a rank's stamp against the task's end would). None with
        fewer than two ranks' beats (one rank, or no telemetry): the caller falls back to the
        reference time."""
        beats = self.for_task(task, instance)
        if len(beats) < 2:
            return None
        silences: dict[int, float] = {}
        for rank in beats:
            key = (task.task_id, rank)
            at = self.peers_at.get(key, {})
            spans = [
                beats[peer].env.wall_time - at[peer]
                for peer in beats
                if peer in at and self.positions.get((task.task_id, peer), 0) > self.positions.get(key, 0)
            ]
            silences[rank] = round(max([0, *spans]) / NS, 3)
        return silences

    def for_rank(self, task: TaskInfo, instance_id: InstanceId, rank: int) -> RunnerHeartbeat | None:
        """A task still running: the rank's newest beat. An ended one: its newest beat about it."""
        if task.ended:
            return self.by_task.get((task.task_id, rank))
        return self.latest.get((instance_id, rank))

    def for_task(self, task: TaskInfo, instance: InstanceInfo) -> dict[int, RunnerHeartbeat]:
        """`for_rank` of every rank of `instance` that has one, by rank."""
        beats = {r.rank: self.for_rank(task, instance.instance_id, r.rank) for r in instance.runners}
        return {rank: beat for rank, beat in beats.items() if beat is not None}

    def latest_of(self, instance: InstanceInfo) -> dict[int, RunnerHeartbeat]:
        """The newest beat of every rank of `instance` that has one, by rank."""
        keys = [(instance.instance_id, r.rank) for r in instance.runners]
        return {key[1]: self.latest[key] for key in keys if key in self.latest}


def top_frame(stack: str) -> str:
    """The innermost `File ...` line of a formatted stack, where the rank sits."""
    frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
    return frames[-1] if frames else stack.strip().splitlines()[-1] if stack.strip() else ""
