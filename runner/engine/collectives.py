"""The only collectives the engine issues, so their sequence is easy to audit.

Every decision that changes what a rank does next comes out of `agree`: an element-wise sum of
small integers that every rank calls at the same point of the same schedule.

The sum goes once around the ring and back, as point-to-point messages from each rank to its
right neighbour: rank 0 sends its vector to rank 1, each rank adds its own and passes the partial
sum on, the last rank sends the total to rank 0 (its right neighbour), and the total is passed on
up to rank world-2. On two ranks that is one message each way per agreement, where mlx's ring
all-reduce takes two rounds; and every message a rank waits for is one its sender sends without
waiting on the receiver, so the receiver can first wait for it in `PeerWait` (a blocking poll)
instead of inside the ring backend, which spins while it waits (`runner/ring_wait.py`). Every
receive is from the left neighbour, in the order sent, after any activation the left neighbour
sent before the agreement (`sends.py`): the bytes on each socket come in the order they are read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import cast

import mlx.core as mx

from runner.engine.protocols import PeerWait
from runner.errors import RingMismatch

DIGEST_BITS = 24  # per part of a member check: world x 2**24 stays an int32 up to 127 ranks
DIGEST_PARTS = 3


def member_digests(identity: str) -> list[int]:
    digest = hashlib.sha256(identity.encode()).digest()
    size = DIGEST_BITS // 8
    return [int.from_bytes(digest[i * size : (i + 1) * size], "big") for i in range(DIGEST_PARTS)]


class Collectives:
    def __init__(self, group: mx.distributed.Group | None, peer_wait: PeerWait | None = None) -> None:
        self.group = group
        self.rank = group.rank() if group is not None else 0
        self.world = group.size() if group is not None else 1
        self._peer_wait = peer_wait

    def agree(self, values: list[int]) -> list[int]:
        """Element-wise sum over ranks (identity for one rank). Blocks until every rank joins."""
        group = self.group
        if group is None or self.world == 1:
            return list(values)
        mine = mx.array(values, dtype=mx.int32)
        last = self.world - 1
        partial = mine if self.rank == 0 else self._receive(group, mine) + mine  # received as it is sent on
        if self.rank == last:
            total = partial
            self._send(group, total)  # to rank 0
        else:
            self._send(group, partial)
            total = self._receive(group, mine)  # rank 0: from the last rank; the others: passed on by rank-1
            if self.rank < last - 1:
                self._send(group, total)
        return [int(v) for v in cast(list[int], total.tolist())]

    def agree_ahead(self, values: list[int], ahead: Callable[[mx.array], Sequence[mx.array]]) -> list[int]:
        """`agree`, where rank 0 of several builds work on the sum before it arrives: `ahead(total)`
        gets the agreed vector as a lazy receive and returns arrays computed from it; rank 0 builds
        them while the last rank still computes, and queues them (`mx.async_eval`) once the sum's
        bytes are in, so they run the moment it lands. (mlx caps the tasks in flight, so that call
        returns only once most of the work has run; the sum is read back after it.) The work may
        queue sends (never start them) and issues no collective, so the sequence of messages is
        `agree`'s. Other ranks: plain `agree`."""
        group = self.group
        if group is None or self.world == 1 or self.rank != 0:
            return self.agree(values)
        mine = mx.array(values, dtype=mx.int32)
        self._send(group, mine)
        total = mx.distributed.recv_like(mine, self.world - 1, group=group)
        work = ahead(total)
        if self._peer_wait is not None:
            self._peer_wait.wait()
        if self.world > 2:
            self._send(group, total)  # passed on before the work is queued, as `agree` does
        mx.async_eval(total)  # first, on its own: the work then starts from received bytes
        mx.async_eval(*work)
        return [int(v) for v in cast(list[int], total.tolist())]

    def check_members(self, identity: str) -> None:
        """The group's first collective: every rank must belong to the instance named by `identity`
        (the same string on every rank of it). Each adds three 24-bit digests of its own; the sums
        are world x its own on every rank iff all are alike, else every rank of the mixed ring raises
        `RingMismatch`, before it computes anything for a group that is not its instance's (ranks of
        two clusters on one host that took the same ring ports connect to each other: mlx's ring
        backend accepts whoever calls, and they then agree on nonsense or wait for ever)."""
        if self.group is None or self.world == 1:
            return
        mine = member_digests(identity)
        summed = self.agree(mine)
        if summed != [self.world * part for part in mine]:
            raise RingMismatch(
                f"rank {self.rank}'s ring group holds a rank of another instance (a ring port of this placement "
                "is held by another cluster's runner on the same host): give each cluster on a host its own "
                "ring_base_port range"
            )

    def any(self, flag: bool) -> bool:
        """True on every rank if any rank passed True."""
        return self.agree([int(flag)])[0] > 0

    def _send(self, group: mx.distributed.Group, vector: mx.array) -> None:
        mx.eval(mx.distributed.send(vector, (self.rank + 1) % self.world, group=group))

    def _receive(self, group: mx.distributed.Group, like: mx.array) -> mx.array:
        """The left neighbour's vector, once its bytes are in (`PeerWait`); lazy, so a rank that
        sends on what it received reads and sends in one evaluation (one round trip into mlx's
        stream, not two: 0.12-0.19 ms less a token on the sampling rank of two, measured step by
        step in one run), and the others read it at `tolist`."""
        if self._peer_wait is not None:
            self._peer_wait.wait()
        return mx.distributed.recv_like(like, (self.rank - 1) % self.world, group=group)
