"""Where each rank's time goes in the overlapped pipeline prefill, from the ranks' timelines
(`runner.local.timeline`: every phase entered, with wall and CPU time). Pure.

An iteration of the pipeline runs from entering `prefill` (its chunk's forward, the wait for the
upstream rank's activations included) to entering its agreement (`agree_cancel`: the one-scalar
all-reduce, then the hand-off of the sends and the progress report) and on to the next phase. A
rank's CPU time in it is its busy time; the rest of the wall time it waited. With M chunks on N
ranks, rank r computes its chunks in iterations r..M+r-1 and idles in the others (the bubble); the
steady iterations N-1..M-1 have every rank computing: how long one takes against a stage's compute
alone is the efficiency the GPipe ideal (which assumes they take the same) leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

# A timeline entry as the rank's JSON holds it: phase, task, iteration, wall ns, CPU ns.
Entry = Sequence[Any]


@dataclass(frozen=True, slots=True)
class Iteration:
    """One rank's prefill iteration: its compute and its agreement, each in wall and CPU ms."""

    iteration: int
    compute_wall_ms: float
    compute_cpu_ms: float
    agree_wall_ms: float
    agree_cpu_ms: float

    @property
    def wall_ms(self) -> float:
        return self.compute_wall_ms + self.agree_wall_ms

    @property
    def busy_ms(self) -> float:
        return self.compute_cpu_ms + self.agree_cpu_ms

    @property
    def idle_ms(self) -> float:
        return max(0.0, self.wall_ms - self.busy_ms)


def iterations(entries: Sequence[Entry], task_id: str) -> dict[int, Iteration]:
    """The prefill iterations of `task_id` on one rank, by iteration; one whose agreement or end
    the timeline does not hold (the rank's last entry) is left out."""
    out: dict[int, Iteration] = {}
    for index, entry in enumerate(entries):
        phase, task, iteration, wall, cpu = _parts(entry)
        if phase != "prefill" or task != task_id or index + 2 >= len(entries):
            continue
        agree_phase, agree_task, agree_iteration, agree_wall, agree_cpu = _parts(entries[index + 1])
        if (agree_phase, agree_task, agree_iteration) != ("agree_cancel", task_id, iteration):
            raise ValueError(f"prefill iteration {iteration} of {task_id} is followed by {entries[index + 1]!r}")
        _, _, _, next_wall, next_cpu = _parts(entries[index + 2])
        out[iteration] = Iteration(
            iteration,
            compute_wall_ms=(agree_wall - wall) / 1e6,
            compute_cpu_ms=(agree_cpu - cpu) / 1e6,
            agree_wall_ms=(next_wall - agree_wall) / 1e6,
            agree_cpu_ms=(next_cpu - agree_cpu) / 1e6,
        )
    return out


def pipeline_account(timelines: Sequence[Sequence[Entry]], task_id: str, chunks: int) -> dict[str, float]:
    """Medians: an iteration's wall time (its slowest rank's) over the steady iterations (every rank
    computing a chunk; over every iteration when the prompt has fewer chunks than ranks), the
    agreement's; each rank's busy and waiting time in the iterations that computed its chunks; and
    an idle iteration's wall time (the bubble's: a rank before its first chunk or after its last)."""
    world = len(timelines)
    per_rank = [iterations(timeline, task_id) for timeline in timelines]
    common = [k for k in range(chunks + world - 1) if all(k in rank for rank in per_rank)]
    steady = [k for k in common if world - 1 <= k < chunks] or common
    if not steady:
        raise ValueError(f"no iteration of {task_id} is on the timelines of all {world} ranks")
    account = {
        "iteration_ms": median(max(rank[k].wall_ms for rank in per_rank) for k in steady),
        "agreement_ms": median(rank[k].agree_wall_ms for rank in per_rank for k in steady),
    }
    bubble: list[float] = []
    for number, rank in enumerate(per_rank):
        own = [rank[k] for k in rank if number <= k < chunks + number]
        bubble += [rank[k].wall_ms for k in rank if not number <= k < chunks + number]
        if own:
            account[f"rank{number}_busy_ms"] = median(i.busy_ms for i in own)
            account[f"rank{number}_idle_ms"] = median(i.idle_ms for i in own)
    if bubble:
        account["bubble_iteration_ms"] = median(bubble)
    return account


def _parts(entry: Entry) -> tuple[str, str | None, int, int, int]:
    phase, task, iteration, wall, cpu = entry
    return str(phase), None if task is None else str(task), int(iteration), int(wall), int(cpu)
