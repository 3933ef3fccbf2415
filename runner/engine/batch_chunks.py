"""One rank's prompt chunks of a continuous batch, pipelined through the ranks (`chunk_ring.py`).

At each step every rank takes the same chunk group (the takers `step_plan.chunk_takers` picks from
the agreed composition: every rank moves each taker past its chunk at once), then computes the
group the ring gives it: rank r the one taken r steps ago, from the activations rank r-1 sent after
the previous step's agreement. Its own send waits for this step's agreement (`sends.PendingSends`),
like a ring micro-batch's. A group holds its streams' runs, so a stream cancelled while its chunks
are in flight ends at once while every rank still computes, sends and receives those chunks: the
sockets' bytes are read in the order they were sent, and every rank issues the same transfers.

Within a step a rank computes its chunk group before its decode micro-batch, on every rank alike:
in lockstep decode the rows' activations go out at once, mid-step, so a chunk sent after the
previous agreement must be read first (docs/ARCHITECTURE.md §6).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runner.engine.batch_prefill import ChunkWork, compute_chunks, starts_fresh
from runner.engine.batch_streams import Stream
from runner.engine.chunk_ring import ChunkRing
from runner.engine.task_run import TaskRun


@dataclass(frozen=True, slots=True)
class ChunkGroup:
    """The chunks taken at one step, as every rank knows them (runs kept past a stream's end)."""

    runs: tuple[TaskRun, ...]
    work: tuple[ChunkWork, ...]
    cost: float  # what its chunks cost (`plan.prefill_cost`), for the pace (`pace.StepPace`)


class PipelinedChunks:
    def __init__(self, rank: int, world: int) -> None:
        self.rank = rank
        self.ring: ChunkRing[ChunkGroup] = ChunkRing(world)

    def take(self, step: int, takers: Sequence[Stream], cost: float) -> None:
        """The takers' next chunks become the group of `step` (agreed data: every rank alike); `cost`:
        what those chunks cost (`Stream.next_chunk_cost`)."""
        if not takers:
            return
        work = []
        for stream in takers:
            start = stream.prompt_done
            tokens = stream.request.prompt_token_ids[start : start + stream.chunks[stream.next_chunk]]
            work.append(ChunkWork(tokens, starts_fresh(stream.run, stream.cached, stream.next_chunk)))
            stream.next_chunk += 1
            stream.lands_at = self.ring.lands_at(step)
        self.ring.take(step, ChunkGroup(tuple(s.run for s in takers), tuple(work), cost))

    def compute(self, step: int) -> float:
        """This rank's part of the group the ring gives it at `step`, its send left queued; what
        that group costs (0: none here)."""
        group = self.ring.work(self.rank, step)
        if group is None:
            return 0.0
        compute_chunks(group.runs, group.work)
        return group.cost

    def retire(self, step: int) -> None:
        self.ring.retire(step)

    def busy(self) -> bool:
        return self.ring.busy()
