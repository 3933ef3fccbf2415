"""The order of an instance's ranks around its ring, along the fastest measured links (pure).

A pipeline's ranks pass activations r -> r+1 and the last rank's token back to rank 0, so every
link of the ring carries each step once: the order that makes the sum of the ring's round trips
least is the fastest. Round trips come from the workers' `LinkMeasured` (either direction; the
smaller when both measured). With no measurement for a pair, the order keeps node ids, so a cluster
that measures nothing places as before. Rings of up to 8 nodes are searched exhaustively (7! orders
with rank 0 fixed)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from events.state import NodeInfo

MAX_SEARCHED = 8


def round_trip_us(a: NodeInfo, b: NodeInfo) -> int | None:
    measured = [link.rtt_us for link in (a.links.get(b.node_id), b.links.get(a.node_id)) if link is not None]
    return min(measured) if measured else None


def ring_cost_us(order: Sequence[NodeInfo]) -> int | None:
    """The sum of round trips around the ring, None when a link of it was never measured."""
    total = 0
    for a, b in zip(order, [*order[1:], order[0]], strict=True):
        rtt = round_trip_us(a, b)
        if rtt is None:
            return None
        total += rtt
    return total


def ring_order(nodes: Sequence[NodeInfo]) -> tuple[list[NodeInfo], int | None]:
    """`nodes` in the ring order with the least measured round trips, and that sum; node-id order
    (and None) when fewer than three nodes or any link is unmeasured."""
    by_id = sorted(nodes, key=lambda n: n.node_id)
    if len(by_id) < 3 or len(by_id) > MAX_SEARCHED or ring_cost_us(by_id) is None:
        return by_id, ring_cost_us(by_id) if len(by_id) >= 2 else None
    first, rest = by_id[0], by_id[1:]
    best: tuple[int, list[NodeInfo]] | None = None
    for perm in itertools.permutations(rest):
        order = [first, *perm]
        cost = ring_cost_us(order)
        if cost is not None and (best is None or cost < best[0]):
            best = (cost, order)
    assert best is not None  # every link was measured: every order has a cost
    return best[1], best[0]
