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
from runner.engine.decode_schedule import DecodeSchedule, next_iteration


@dataclass(slots=True, eq=False)  # told apart by identity
class MicroBatch:
    rows: tuple[str, ...] = ()  # in the cache's row order
    cache: BatchShardCache | None = None


class MicroBatches:
    def __init__(self, world: int, ring: bool = True) -> None:
        """`ring`: False keeps every row in one micro-batch on any number of ranks, always lockstep
        (agreed: `shared_cores.agree_lockstep`)."""
        self.schedule = DecodeSchedule(world, world)
        self.parts = [MicroBatch() for _ in range(world if ring else 1)]
        self.iteration: int | None = None  # None: lockstep (parts[0] alone holds rows)

    @property
    def lockstep(self) -> bool:
        return self.iteration is None

    @property
    def rows(self) -> tuple[str, ...]:
        return tuple(t for part in self.parts for t in part.rows)

    def working(self, rank: int) -> MicroBatch | None:
        """What `rank` computes at this step (None: an idle slot of the ring)."""
        if self.iteration is None:
            return self.parts[0]
        micro = self.schedule.work(rank, self.iteration)
        return None if micro is None else self.parts[micro]

    def boundary(self) -> MicroBatch | None:
        """The micro-batch whose tokens this step agrees on (None: the ring is still filling)."""
        if self.iteration is None:
            return self.parts[0]
        micro = self.schedule.boundary(self.iteration)
        return None if micro is None else self.parts[micro]

    def join_target(self) -> MicroBatch | None:
        """Where a prefilled stream joins now, if it may: in lockstep the empty second micro-batch
        (starting the ring) unless the first is empty; on the ring the boundary one (None while the
        ring fills), up to its share (`join_room`)."""
        boundary = self.boundary()
        if self.iteration is None:
            return self.parts[1] if self.parts[0].rows and len(self.parts) > 1 else boundary
        return boundary

    def join_room(self, waiting: int) -> int:
        """How many of `waiting` prefilled streams may join `join_target` now. One rank: all of them
        (one micro-batch, nothing to balance). Several: as many as bring the target to its share of
        every row, decoding or waiting, over the micro-batches (rounded up), so a burst is in once
        each micro-batch's boundary came by, and the ring stays balanced (it moves with its largest
        micro-batch); in lockstep at least one, which starts the ring. (One at a time, keeping the
        boundary within a row of the smallest, a burst of 16 took 8 ring iterations to join.)"""
        target = self.join_target()
        if len(self.parts) == 1:
            return waiting
        if target is None:
            return 0
        share = -(-(len(self.rows) + waiting) // len(self.parts))
        room = share - len(target.rows)
        return min(waiting, max(1, room) if self.iteration is None else max(0, room))

    def rows_elsewhere(self) -> int:
        return len(self.rows_in_flight())

    def rows_in_flight(self) -> tuple[str, ...]:
        """The rows of every micro-batch but the boundary one: mid-ring, they stay this step."""
        boundary = self.boundary()
        return tuple(t for part in self.parts if part is not boundary for t in part.rows)

    def advance(self) -> None:
        """After the step's membership changes: the next step's mode and iteration."""
        boundary = self.boundary()
        just_agreed = None if boundary is None else self.parts.index(boundary)  # by identity
        self.iteration = next_iteration(self.iteration, [bool(part.rows) for part in self.parts], just_agreed)
        if self.iteration is None and not self.parts[0].rows:  # the one left becomes the first
            occupied = [part for part in self.parts if part.rows]
            if occupied:
                index = self.parts.index(occupied[0])
                self.parts[0], self.parts[index] = self.parts[index], self.parts[0]
