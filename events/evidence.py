"""What each rank of an instance was doing at a reference time, read one way for everyone.

The master's watchdog builds it from the newest heartbeat it heard of each rank; `shoal diagnose`
from the heartbeats in the log. Both hand it to `events.culprit`, so neither can read a phase, a
silence or a stack differently from the other. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from events.catalogue import RunnerHeartbeat
from events.state import InstanceInfo, RankProgress, RunnerState, TaskInfo
from events.vocabulary import Phase

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
    "ring_wait.py",
)


class RankView(msgspec.Struct, frozen=True, kw_only=True):
    """One rank as last seen before the reference (times are seconds before it)."""

    rank: int
    node_id: str
    runner_status: RunnerState
    # The heartbeat's phase, else inferred from the task's events (decode once a chunk was
    # generated, prefill once progress was reported); None: nothing shows the rank started.
    phase: Phase | None
    iteration: int | None = None
    processed: int | None = None
    total: int | None = None
    last_progress_ago_s: float | None = None
    heartbeat_ago_s: float | None = None  # None: no heartbeat from this rank
    phase_age_s: float | None = None  # how long the rank had been in `phase` at its last heartbeat
    stack: str | None = None

    @property
    def phase_text(self) -> str:
        return self.phase or "no phase known"

    @property
    def prefill_done(self) -> bool:
        """Finished its real chunks: from here a rank only runs trailing idle iterations."""
        return self.total is not None and self.processed is not None and 0 < self.total <= self.processed + 1


def ago(reference_ns: int, at_ns: int) -> float:
    return round(max(0, reference_ns - at_ns) / NS, 3)


def rank_views(
    task: TaskInfo | None,
    instance: InstanceInfo,
    beats: Mapping[int, RunnerHeartbeat],
    reference_ns: int,
    silences: Mapping[int, float] | None = None,
) -> tuple[RankView, ...]:
    """Every rank of `instance`, about `task` (None: the instance alone), from `beats` by rank.
    `silences`: each rank's heartbeat silence as measured elsewhere (on its peers' clocks,
    `services.ops.ranks.Heartbeats.silences`), instead of its newest beat against `reference_ns`."""
    views: list[RankView] = []
    for runner in instance.runners:
        beat = beats.get(runner.rank)
        progress = task.progress.get(runner.rank) if task is not None else None
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
                heartbeat_ago_s=_silence(runner.rank, beat, reference_ns, silences),
                phase_age_s=beat.phase_age_ms / 1000 if beat else None,
                stack=beat.stack if beat else None,
            )
        )
    return tuple(views)


def _silence(
    rank: int, beat: RunnerHeartbeat | None, reference_ns: int, silences: Mapping[int, float] | None
) -> float | None:
    if beat is None:
        return None
    if silences is not None and rank in silences:
        return silences[rank]
    return ago(reference_ns, beat.env.wall_time)


def _phase(task: TaskInfo | None, beat: RunnerHeartbeat | None, progress: RankProgress | None) -> Phase | None:
    if beat is not None:
        return beat.phase
    if task is not None and task.chunks:
        return "decode"
    if progress is not None:
        return "prefill"
    return None


def _iteration(task: TaskInfo | None, beat: RunnerHeartbeat | None, progress: RankProgress | None) -> int | None:
    candidates: list[int] = []
    if progress is not None:
        candidates.append(progress.iteration)
    # A heartbeat also counts idle iterations, which publish no progress.
    if task is not None and beat is not None and beat.task_id == task.task_id and beat.phase == "prefill":
        candidates.append(beat.iteration)
    return max(candidates) if candidates else None


def is_collective(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in COLLECTIVE_MARKERS)


def waits_in_collective(phase: Phase | None, stack: str | None) -> bool:
    """Is the rank waiting for its peers? Judged by where it sits, not by how it got there.

    With a stack, only the innermost frame counts: a rank sleeping (or computing) inside a cancel
    poll has `agree_to_stop` further out in its stack, yet it is the one the others wait for.
    Without a stack, the phase name is all there is.
    """
    if stack and stack.strip():
        return is_collective(innermost_frame(stack))
    return phase is not None and is_collective(phase)


def innermost_frame(stack: str) -> str:
    """The innermost `File ...` line of a formatted stack and the source line under it."""
    lines = [line.strip() for line in stack.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not starts:
        return lines[-1] if lines else ""
    return "\n".join(lines[starts[-1] : starts[-1] + 2])
