"""What each rank of a task was doing, from the folded State and the newest heartbeats."""

from __future__ import annotations

from collections.abc import Mapping

from events.catalogue import RunnerHeartbeat
from events.ids import InstanceId, TaskId
from events.state import InstanceInfo, RankProgress, TaskInfo
from services.ops.findings import RankView

NS = 1_000_000_000
# Words in a stack or phase name that mean "waiting for the other ranks", not computing.
COLLECTIVE_MARKERS: tuple[str, ...] = (
    "all_sum",
    "all_gather",
    "all_reduce",
    "distributed",
    "recv",
    "send",
    "barrier",
    "agree",
    "collectives.py",
)
WORKING_PHASES = frozenset({"prefill", "decode", "agree_start"})


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


def ago(reference_ns: int, at_ns: int) -> float:
    return round(max(0, reference_ns - at_ns) / NS, 3)


def is_collective(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in COLLECTIVE_MARKERS)


def waits_in_collective(phase: str, stack: str | None) -> bool:
    """Is the rank waiting for its peers? Judged by where it sits, not by how it got there.

    With a stack, only the innermost frame counts: a rank sleeping (or computing) inside a cancel
    poll has `agree_to_stop` further out in its stack, yet it is the one the others wait for.
    Without a stack, the phase name is all there is.
    """
    if stack and stack.strip():
        return is_collective(innermost_frame(stack))
    return is_collective(phase)


def innermost_frame(stack: str) -> str:
    """The innermost `File ...` line of a formatted stack and the source line under it."""
    lines = [line.strip() for line in stack.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not starts:
        return lines[-1] if lines else ""
    return "\n".join(lines[starts[-1] : starts[-1] + 2])


def top_frame(stack: str) -> str:
    """The innermost `File ...` line of a formatted stack, where the rank sits."""
    frames = [line.strip() for line in stack.splitlines() if line.strip().startswith("File ")]
    return frames[-1] if frames else stack.strip().splitlines()[-1] if stack.strip() else ""


def prefill_done(progress: RankProgress | None) -> bool:
    """Finished its real chunks: from here a rank only runs trailing idle iterations."""
    return progress is not None and progress.total > 0 and progress.processed >= progress.total - 1


def rank_views(task: TaskInfo, instance: InstanceInfo, beats: Heartbeats, reference_ns: int) -> tuple[RankView, ...]:
    views: list[RankView] = []
    for runner in instance.runners:
        beat = beats.for_rank(task, instance.instance_id, runner.rank)
        progress = task.progress.get(runner.rank)
        views.append(
            RankView(
                rank=runner.rank,
                node_id=runner.node_id,
                runner_status=runner.status,
                phase=_phase(task, beat, progress),
                iteration=_iteration(task, beat, progress),
                processed=progress.processed if progress else None,
                total=progress.total if progress else None,
                last_progress_ago_s=ago(reference_ns, progress.at) if progress else None,
                heartbeat_ago_s=ago(reference_ns, beat.env.wall_time) if beat else None,
                phase_age_s=beat.phase_age_ms / 1000 if beat else None,
                stack=beat.stack if beat else None,
            )
        )
    return tuple(views)


def _phase(task: TaskInfo, beat: RunnerHeartbeat | None, progress: RankProgress | None) -> str:
    if beat is not None:
        return beat.phase
    if task.chunks:
        return "decode"
    if progress is not None:
        return "prefill"
    return "waiting"


def _iteration(task: TaskInfo, beat: RunnerHeartbeat | None, progress: RankProgress | None) -> int | None:
    candidates: list[int] = []
    if progress is not None:
        candidates.append(progress.iteration)
    # A heartbeat also counts idle iterations, which publish no progress.
    if beat is not None and beat.task_id == task.task_id and beat.phase == "prefill":
        candidates.append(beat.iteration)
    return max(candidates) if candidates else None
