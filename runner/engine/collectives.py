"""The only collectives the engine issues, so their sequence is easy to audit.

Every decision that changes what a rank does next comes out of `agree`: an all-reduce of
small integers that every rank calls at the same point of the same schedule.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx


class Collectives:
    def __init__(self, group: mx.distributed.Group | None) -> None:
        self.group = group
        self.rank = group.rank() if group is not None else 0
        self.world = group.size() if group is not None else 1

    def agree(self, values: list[int]) -> list[int]:
        """Element-wise sum over ranks (identity for one rank). Blocks until every rank joins."""
        if self.group is None or self.world == 1:
            return list(values)
        summed = mx.distributed.all_sum(mx.array(values, dtype=mx.int32), group=self.group)
        mx.eval(summed)
        return [int(v) for v in cast(list[int], summed.tolist())]

    def any(self, flag: bool) -> bool:
        """True on every rank if any rank passed True."""
        return self.agree([int(flag)])[0] > 0
