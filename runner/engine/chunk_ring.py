"""Pipelined prefill chunks of a continuous batch, pure: which chunk group each rank computes at each
step, and when a group has passed every rank. The prefill counterpart of the decode ring
(`decode_schedule.py`), GPipe-style like the lone-prompt pipeline path (`plan.rank_schedule`).

Sequential chunks go through every rank inside one step, so each rank waits while the others
compute their part of the chunk and prefill runs at one rank's speed. Here a chunk group taken at
step t (from agreed data: `step_plan.chunk_takers` over the composition) is computed by rank r at
step t + r; rank r's send of it starts after that step's agreement and rank r+1 receives it at the
next step. A group may be taken at every step, so each rank carries at most one group's part per
step while N ranks prefill N groups at once.

Invariants (docs/ARCHITECTURE.md §6), checked by tests/runner/test_chunk_ring.py:
- every group is computed by every rank exactly once, rank r+1 exactly one step after rank r (what
  rank r sends after a step's agreement, rank r+1 receives at the next step, in the order sent);
- a rank computes at most one group per step;
- a group has passed the last rank once the agreement of step t + N - 1 is in (`lands_at`): only then
  may its streams join the decoding rows, at the same step on every rank;
- the ring is `busy` while a group still has a rank to reach, cancelled streams' groups included
  (every rank still sends and receives them), so the batch keeps stepping until it is drained.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Group = TypeVar("Group")


@dataclass(slots=True)
class ChunkRing(Generic[Group]):
    world: int
    _groups: deque[tuple[int, Group]] = field(default_factory=deque)  # (step taken, group), in step order

    def __post_init__(self) -> None:
        if self.world < 1:
            raise ValueError(f"need at least one rank, got {self.world}")

    def lands_at(self, taken_at: int) -> int:
        """The step whose agreement sees a group taken at `taken_at` past the last rank."""
        return taken_at + self.world - 1

    def take(self, step: int, group: Group) -> None:
        """A group taken at `step` (rank 0 computes it at once); steps only move forward."""
        if self._groups and self._groups[-1][0] >= step:
            raise ValueError(f"a group taken at step {step} after one taken at step {self._groups[-1][0]}")
        self._groups.append((step, group))

    def work(self, rank: int, step: int) -> Group | None:
        """The group `rank` computes at `step`: the one taken at `step - rank`, if any."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} outside world of {self.world}")
        for taken_at, group in self._groups:
            if taken_at == step - rank:
                return group
        return None

    def retire(self, step: int) -> None:
        """After `step`'s agreement: forget the groups the last rank has computed."""
        while self._groups and self.lands_at(self._groups[0][0]) <= step:
            self._groups.popleft()

    def busy(self) -> bool:
        """Whether a group still has a rank to reach (call after `retire`)."""
        return bool(self._groups)
