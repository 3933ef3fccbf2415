"""`bench.prefill_timeline`: where each rank's time goes in the overlapped pipeline prefill, read
from timelines built here as a rank writes them (phase, task, iteration, wall ns, CPU ns)."""

from __future__ import annotations

import pytest

from bench.prefill_timeline import iterations, pipeline_account
from runner.engine.plan import rank_schedule

MS = 1_000_000


def rank_timeline(rank: int, world: int, chunks: int, compute_ms: float, idle_ms: float) -> list[list]:
    """A rank's entries for task "pipeline-0": each iteration computes (CPU = wall) then waits
    `idle_ms` in its agreement; an idle iteration of the bubble only waits, 5 ms."""
    entries: list[list] = [["warming_up", None, 0, 0, 0]]
    wall = cpu = 10 * MS
    for iteration, chunk in enumerate(rank_schedule(rank, world, chunks, "pipeline")):
        entries.append(["prefill", "pipeline-0", iteration, wall, cpu])
        if chunk is not None:
            wall, cpu = wall + int(compute_ms * MS), cpu + int(compute_ms * MS)
        entries.append(["agree_cancel", "pipeline-0", iteration, wall, cpu])
        wall += int((idle_ms if chunk is not None else 5) * MS)
    entries.append(["decode", "pipeline-0", 0, wall, cpu])
    return entries


def test_each_iteration_splits_into_compute_and_agreement_in_wall_and_cpu_time() -> None:
    got = iterations(rank_timeline(1, 2, 4, compute_ms=20, idle_ms=3), "pipeline-0")
    assert sorted(got) == [0, 1, 2, 3, 4]  # one leading idle iteration, four chunks
    assert got[0].compute_wall_ms == 0 and got[0].agree_wall_ms == 5 and got[0].busy_ms == 0
    assert got[2].compute_wall_ms == 20 and got[2].compute_cpu_ms == 20 and got[2].agree_wall_ms == 3
    assert got[2].wall_ms == 23 and got[2].busy_ms == 20 and got[2].idle_ms == 3
    assert iterations(rank_timeline(1, 2, 4, 20, 3), "another-task") == {}


def test_the_account_reads_the_steady_iterations_and_the_slowest_rank() -> None:
    timelines = [rank_timeline(0, 2, 6, compute_ms=20, idle_ms=4), rank_timeline(1, 2, 6, compute_ms=22, idle_ms=2)]
    account = pipeline_account(timelines, "pipeline-0", chunks=6)
    assert account["iteration_ms"] == 24  # both 24 ms: the agreement waits for the slower compute
    assert account["rank0_busy_ms"] == 20 and account["rank0_idle_ms"] == 4
    assert account["rank1_busy_ms"] == 22 and account["rank1_idle_ms"] == 2
    assert account["agreement_ms"] == 3  # the median of 4 and 2
    assert account["bubble_iteration_ms"] == 5  # rank 1's first iteration, rank 0's last


def test_an_agreement_missing_after_a_prefill_iteration_is_an_error_not_a_guess() -> None:
    entries = rank_timeline(0, 2, 3, 20, 3)
    del entries[2]  # iteration 0's agree_cancel
    with pytest.raises(ValueError, match="iteration 0 of pipeline-0 is followed by"):
        iterations(entries, "pipeline-0")
    with pytest.raises(ValueError, match="no iteration of pipeline-0 is on the timelines of all 2 ranks"):
        pipeline_account([rank_timeline(0, 2, 3, 20, 3), []], "pipeline-0", chunks=3)


def test_a_prompt_of_fewer_chunks_than_ranks_is_read_over_every_iteration() -> None:
    timelines = [rank_timeline(rank, 3, 2, compute_ms=20, idle_ms=4) for rank in range(3)]
    account = pipeline_account(timelines, "pipeline-0", chunks=2)  # no iteration has all 3 computing
    assert account["iteration_ms"] == 24  # each of the 4 iterations has a rank computing
    assert all(account[f"rank{r}_busy_ms"] == 20 and account[f"rank{r}_idle_ms"] == 4 for r in range(3))
    assert account["bubble_iteration_ms"] == 5
