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


def micro_batch_count(rows: int, world: int) -> int:
    """As many micro-batches as ranks, so every rank has work each iteration, but never an empty
    one (a one-row batch on two ranks stays one micro-batch: nothing to overlap)."""
    return max(1, min(rows, world))


def split_rows(rows: int, micro_batches: int) -> list[range]:
    """Contiguous row ranges, the first `rows % micro_batches` one row larger (balanced stages)."""
    if micro_batches < 1:
        raise ValueError(f"need at least one micro-batch, got {micro_batches}")
    base, extra = divmod(rows, micro_batches)
    ranges, start = [], 0
    for micro in range(micro_batches):
        size = base + (1 if micro < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges
