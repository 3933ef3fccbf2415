"""The decoding rows of a continuous batch, split into micro-batches that ride the decode ring.

On N ranks the rows are held in up to N micro-batches. While one micro-batch holds every row the
batch decodes in *lockstep*: it goes through every rank in one step (sends at once), as a task
alone decodes, one all-reduce per token. A stream that finishes its prefill then joins a second
micro-batch, and the batch switches to the *ring* (`decode_schedule.DecodeSchedule(N, N)`): at
each step rank r computes the micro-batch the schedule gives it, so rank r works on one
micro-batch while rank r-1 works on the next, its send starting after the step's agreement; the
all-reduce carries the tokens of the micro-batch the last rank just sampled (the *boundary* one).
`decode_schedule.next_iteration` says when to switch, from agreed data only.

Only the boundary micro-batch changes membership (its rows leave, a prefilled stream joins it),
so no rank holds an activation of a micro-batch whose rows change, and every rank holds the same
split at every step. One rank: one micro-batch, always lockstep (the plain batch).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.engine.batch_cache import BatchShardCache
from runner.engine.step_plan import MicroLayout


@dataclass(slots=True, eq=False)  # told apart by identity
class MicroBatch:
    rows: tuple[str, ...] = ()  # in the cache's row order
    cache: BatchShardCache | None = None


class MicroBatches:
    """The micro-batches with their caches; every decision about them is `step_plan.MicroLayout`'s,
    on their rows alone."""

    def __init__(self, world: int, ring: bool = True) -> None:
        """`ring`: False keeps every row in one micro-batch on any number of ranks, always lockstep
        (agreed: `shared_cores.agree_lockstep`)."""
        self.world = world
        self.parts = [MicroBatch() for _ in range(world if ring else 1)]
        self.iteration: int | None = None  # None: lockstep (parts[0] alone holds rows)

    @property
    def layout(self) -> MicroLayout:
        return MicroLayout(self.world, tuple(part.rows for part in self.parts), self.iteration)

    @property
    def lockstep(self) -> bool:
        return self.iteration is None

    @property
    def rows(self) -> tuple[str, ...]:
        return tuple(t for part in self.parts for t in part.rows)

    def working(self, rank: int) -> MicroBatch | None:
        """What `rank` computes at this step (None: an idle slot of the ring)."""
        return self._part(self.layout.working(rank))

    def boundary(self) -> MicroBatch | None:
        """The micro-batch whose tokens this step agrees on (None: the ring is still filling)."""
        return self._part(self.layout.boundary())

    def join_target(self) -> MicroBatch | None:
        """Where a prefilled stream joins now, if it may (`MicroLayout.join_target`)."""
        return self._part(self.layout.join_target())

    def join_room(self, waiting: int) -> int:
        return self.layout.join_room(waiting)

    def rows_elsewhere(self) -> int:
        return len(self.layout.rows_in_flight())

    def advance(self) -> None:
        """After the step's membership changes: the next step's mode and iteration."""
        self.follow(*self.layout.advanced())

    def follow(self, layout: MicroLayout, order: tuple[int, ...]) -> None:
        """Take the next step's layout a plan computed (`step_plan.StepPlan.micro`): its micro-batch
        `i` is this step's `order[i]`; their rows must be what the executor made them."""
        parts = [self.parts[index] for index in order]
        if tuple(part.rows for part in parts) != layout.parts:
            raise RuntimeError("internal error: the micro-batches' rows are not the ones the step planned")
        self.parts, self.iteration = parts, layout.iteration

    def _part(self, index: int | None) -> MicroBatch | None:
        return None if index is None else self.parts[index]
