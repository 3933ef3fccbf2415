"""The decoding rows of a continuous batch, split into micro-batches that ride the decode ring.

On N ranks the rows are held in N micro-batches (`decode_schedule.DecodeSchedule(N, N)`): at each
step rank r computes the micro-batch the schedule gives it, so rank r works on one micro-batch
while rank r-1 works on the next, and the step's all-reduce carries the tokens of the micro-batch
the last rank just sampled (the *boundary* one). Only the boundary micro-batch changes membership
(its rows leave, a prefilled stream joins it), so no rank holds an activation of a micro-batch
whose rows change. Every rank holds the same split: it changes only through agreed transitions.

An empty micro-batch is an idle slot of the ring. While every micro-batch is empty nothing is in
flight, so the ring restarts at `world - 1`, the iteration where micro-batch 0 is the boundary:
a newcomer joins at once and reaches rank 0 at the next step. One rank: one micro-batch, always
the boundary (the plain batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.engine.batch_cache import BatchShardCache
from runner.engine.decode_schedule import DecodeSchedule


@dataclass(slots=True)
class MicroBatch:
    rows: tuple[str, ...] = ()  # in the cache's row order
    cache: BatchShardCache | None = None


class MicroBatches:
    def __init__(self, world: int) -> None:
        self.schedule = DecodeSchedule(world, world)
        self.parts = [MicroBatch() for _ in range(world)]
        self.iteration = self._restart

    @property
    def _restart(self) -> int:
        return self.schedule.world - 1

    @property
    def rows(self) -> tuple[str, ...]:
        return tuple(t for part in self.parts for t in part.rows)

    def working(self, rank: int) -> MicroBatch | None:
        """What `rank` computes at this step (None: an idle slot)."""
        micro = self.schedule.work(rank, self.iteration)
        return None if micro is None else self.parts[micro]

    def boundary(self) -> MicroBatch:
        micro = self.schedule.boundary(self.iteration)
        if micro is None:  # the ring never fills from empty: it restarts where it is full
            raise RuntimeError(f"internal error: no boundary at decode iteration {self.iteration}")
        return self.parts[micro]

    def may_join(self) -> bool:
        """A prefilled stream joins the boundary micro-batch only when it is one of the smallest,
        so the micro-batches stay balanced (the ring moves as fast as its largest one)."""
        return len(self.boundary().rows) == min(len(part.rows) for part in self.parts)

    def rows_elsewhere(self) -> int:
        boundary = self.boundary()
        return sum(len(part.rows) for part in self.parts if part is not boundary)

    def advance(self) -> None:
        self.iteration = self.iteration + 1 if self.rows else self._restart
