"""The ring follows the fastest measured links (services/master/ring.py), and placement uses it."""

from __future__ import annotations

from events.catalogue import LinkMeasured
from events.ids import NodeId
from events.state import LinkInfo, NodeInfo
from services.master.core import MasterPolicy
from services.master.placement import NodeCount
from services.master.ring import ring_cost_us, ring_order
from tests.services.master.test_core import Cluster
from tests.services.master.test_orchestration import Sized, placed


def _node(name: str, links: dict[str, int]) -> NodeInfo:
    measured = {NodeId(peer): LinkInfo(rtt_us=rtt, bytes_per_second=1, at=0) for peer, rtt in links.items()}
    return NodeInfo(
        node_id=NodeId(name), host=name, cores=1, memory_bytes=1, backend="cpu", version="t", links=measured
    )


# Four hosts on a line a - b - c - d (neighbours 1 ms apart): the ring a b c d a crosses 3 ms back
# from d; a b d c a costs the same; a c b d a crosses the far links twice.
LINE = {"a": 0, "b": 1000, "c": 2000, "d": 3000}


def _line_nodes(names: str) -> list[NodeInfo]:
    return [_node(n, {p: abs(LINE[n] - LINE[p]) + 100 for p in names if p != n}) for n in names]


def test_the_ring_order_is_the_one_with_the_least_round_trips() -> None:
    nodes = _line_nodes("dbca")
    order, cost = ring_order(nodes)
    assert cost == min(c for c in (ring_cost_us(o) for o in _all_orders(nodes)) if c is not None)
    assert order[0].node_id == "a" and cost == 6400  # 1+1+1+3 ms and 4 x 100 us


def test_an_unmeasured_link_keeps_the_node_id_order() -> None:
    nodes = [_node("c", {}), _node("a", {"b": 5}), _node("b", {"a": 5})]
    assert [n.node_id for n in ring_order(nodes)[0]] == ["a", "b", "c"]
    assert ring_order(nodes)[1] is None


def test_either_direction_counts_and_the_faster_wins() -> None:
    a, b = _node("a", {"b": 900}), _node("b", {"a": 300})
    assert ring_cost_us([a, b]) == 600


def test_placement_over_three_nodes_orders_the_ranks_along_the_fastest_ring() -> None:
    c = Cluster(MasterPolicy(nodes_per_instance=NodeCount(least=3)), Sized(m=1), pipeline=False)
    c.feed(*(c.ev.node(n, 8, host=n) for n in "abcd"[:3]))
    positions = {"a": 0, "b": 5000, "c": 1000}  # c sits between a and b
    for n in "abc":
        for p in "abc":
            if n != p:
                env = c.ev.worker(n).stamp()
                rtt = abs(positions[n] - positions[p]) + 100
                c.feed(LinkMeasured(env=env, node_id=NodeId(n), peer=NodeId(p), rtt_us=rtt, bytes_per_second=1))
    [instance] = placed(c.feed(c.ev.created("t1", model="m")))
    assert [s.node_id for s in sorted(instance.shards, key=lambda s: s.rank)] in (["a", "c", "b"], ["a", "b", "c"])
    assert "ring ordered by measured round trips" in instance.reason


def _measure(c: Cluster, rtt_us: dict[frozenset[str], int]) -> None:
    """Every node measures every peer, at the given round trips (both directions alike)."""
    names = sorted({n for pair in rtt_us for n in pair})
    for n in names:
        for p in names:
            if n != p:
                rtt = rtt_us[frozenset((n, p))]
                env = c.ev.worker(n).stamp()
                c.feed(LinkMeasured(env=env, node_id=NodeId(n), peer=NodeId(p), rtt_us=rtt, bytes_per_second=1))


def _links(fast: set[frozenset[str]], names: str) -> dict[frozenset[str], int]:
    return {frozenset((a, b)): 200 if frozenset((a, b)) in fast else 10_000 for a in names for b in names if a != b}


def test_a_split_instance_takes_the_nodes_with_the_fastest_link_over_roomier_ones() -> None:
    c = Cluster(MasterPolicy(nodes_per_instance=NodeCount(least=2)), Sized(m=1), pipeline=False)
    c.feed(c.ev.node("a", 9, host="a"), c.ev.node("b", 9, host="b"), c.ev.node("c", 8, host="c"))
    c.feed(c.ev.node("d", 8, host="d"))
    _measure(c, _links({frozenset("cd")}, "abcd"))  # a and b are roomier, c - d is the fast link
    [instance] = placed(c.feed(c.ev.created("t1", model="m")))
    assert sorted(s.node_id for s in instance.shards) == ["c", "d"]
    assert "faster than with a, b" in instance.reason


def test_with_no_link_measured_the_roomiest_nodes_are_taken() -> None:
    c = Cluster(MasterPolicy(nodes_per_instance=NodeCount(least=2)), Sized(m=1), pipeline=False)
    c.feed(c.ev.node("a", 8, host="a"), c.ev.node("b", 9, host="b"), c.ev.node("c", 9, host="c"))
    [instance] = placed(c.feed(c.ev.created("t1", model="m")))
    assert sorted(s.node_id for s in instance.shards) == ["b", "c"]
    assert "round trips" not in instance.reason


def test_a_fast_link_never_buys_more_nodes_than_the_model_needs() -> None:
    c = Cluster(MasterPolicy(), Sized(m=1), pipeline=False)
    c.feed(c.ev.node("a", 4, host="a"), c.ev.node("b", 4, host="b"))
    _measure(c, _links({frozenset("ab")}, "ab"))
    [instance] = placed(c.feed(c.ev.created("t1", model="m")))
    assert len(instance.shards) == 1


def test_a_fast_link_to_a_node_without_room_is_passed_over() -> None:
    c = Cluster(MasterPolicy(nodes_per_instance=NodeCount(least=2)), Sized(m=6), pipeline=False)
    # m needs 7.5 GiB with its KV room: c - d is fast but d (1 GiB) cannot take its share
    c.feed(c.ev.node("a", 6, host="a"), c.ev.node("b", 6, host="b"), c.ev.node("c", 6, host="c"))
    c.feed(c.ev.node("d", 1, host="d"))
    _measure(c, _links({frozenset("cd"), frozenset("bc")}, "abcd"))
    [instance] = placed(c.feed(c.ev.created("t1", model="m")))
    assert sorted(s.node_id for s in instance.shards) == ["b", "c"]


def _all_orders(nodes: list[NodeInfo]) -> list[list[NodeInfo]]:
    import itertools

    return [list(p) for p in itertools.permutations(nodes)]
