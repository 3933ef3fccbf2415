"""Pipelined decode, pure: which micro-batch each rank computes at each iteration, and where the
ranks agree. The decode counterpart of the GPipe prefill schedule (`plan.rank_schedule`).

Lockstep decode runs the whole batch through rank 0, then rank 1, ..., so N-1 of N ranks idle.
Here the decoding rows are split into `micro_batches` groups and the ranks form a ring of period
`P = max(micro_batches, world)`: at iteration t rank r computes micro-batch `(t - r) mod P` (if
that many exist, and once `t >= r`), so micro-batch m reaches rank r at iteration m + r + kP,
one iteration after rank r-1 computed it, and the last rank samples it at iteration
m + (world-1) + kP while rank 0 is busy with another micro-batch.

Invariants (docs/ARCHITECTURE.md §6), checked by tests/runner/test_decode_schedule.py:
- every iteration ends in one all-reduce on every rank (idle ones included), whose token part
  belongs to the micro-batch the last rank finished in that iteration (`boundary`), if any;
- a micro-batch's membership changes (joins, leaves, cancels) only at its own boundary: then no
  rank holds any of its activations, and rank 0 next computes it strictly after that agreement
  (`next_entry`), so every rank filters or extends that micro-batch's cache at the same point;
- no send left behind: rank r's send of iteration t is received by rank r+1 at iteration t+1,
  and the sends of an iteration start only after its agreement, as on the pipeline prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecodeSchedule:
    world: int
    micro_batches: int

    def __post_init__(self) -> None:
        if self.world < 1 or self.micro_batches < 1:
            raise ValueError(f"need at least one rank and one micro-batch, got {self.world} and {self.micro_batches}")

    @property
    def period(self) -> int:
        return max(self.micro_batches, self.world)

    def work(self, rank: int, iteration: int) -> int | None:
        """The micro-batch `rank` computes at `iteration`, or None (an idle slot of the ring)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside world of {self.world}")
        if iteration < rank:
            return None  # the pipeline is still filling
        micro = (iteration - rank) % self.period
        return micro if micro < self.micro_batches else None

    def boundary(self, iteration: int) -> int | None:
        """The micro-batch whose tokens this iteration's agreement carries (the last rank sampled it)."""
        return self.work(self.world - 1, iteration)

    def next_entry(self, micro: int, boundary_iteration: int) -> int:
        """The first iteration after `boundary_iteration` at which rank 0 computes `micro` again."""
        gap = (micro - boundary_iteration) % self.period
        return boundary_iteration + (gap or self.period)

    def receives(self, rank: int, iteration: int) -> bool:
        """Whether `rank` receives activations from rank-1 at `iteration` (never rank 0)."""
        return rank > 0 and self.work(rank, iteration) is not None

    def sends(self, rank: int, iteration: int) -> bool:
        """Whether `rank`'s work at `iteration` goes on to rank+1 (after the iteration's agreement)."""
        return rank < self.world - 1 and self.work(rank, iteration) is not None


def next_iteration(iteration: int | None, occupied: Sequence[bool], just_agreed: int | None) -> int | None:
    """The ring's iteration for the next step, from agreed data only; None: lockstep.

    Lockstep (one micro-batch, index 0, through every rank in one step, as a task alone decodes)
    is what a lone micro-batch wants: on a ring it would take `world` steps, each with its own
    all-reduce, per token. The ring starts (at iteration 0, so each micro-batch enters rank 0 in
    turn and no rank computes one it has not received) once a second micro-batch holds rows, and
    stops once at most one does and nothing is in flight: the one left (if any) is the micro-batch
    whose tokens were `just_agreed` (the caller moves it to index 0)."""
    busy = [micro for micro, rows in enumerate(occupied) if rows]
    if iteration is None:
        return 0 if any(occupied[1:]) else None
    if not busy or (len(busy) == 1 and busy[0] == just_agreed):
        return None
    return iteration + 1
