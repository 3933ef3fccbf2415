"""The heartbeats a diagnosis reads, and where a rank's stack says it sits."""

from __future__ import annotations

from collections.abc import Mapping

from events.catalogue import RunnerHeartbeat
from events.ids import InstanceId, TaskId
from events.state import InstanceInfo, TaskInfo


class Heartbeats:
    """Read-only view of the newest heartbeats (see `scan.HeartbeatIndex`)."""

    def __init__(
        self,
        latest: Mapping[tuple[InstanceId, int], RunnerHeartbeat],
        by_task: Mapping[tuple[TaskId, int], RunnerHeartbeat],
    ) -> None:
        self.latest = latest
        self.by_task = by_task

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
