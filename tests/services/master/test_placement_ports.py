"""Ring ports after failed placements: a port another program holds on a host (a long-lived
connection's ephemeral port, when the base lies in the kernel's ephemeral range) fails every
placement that takes it, so the next attempt takes other ports; a ready placement ends the streak,
and the ports never walk far from the base. Table tests over the master core, on a fake clock."""

from __future__ import annotations

from events.catalogue import InstancePlaced
from services.master.core import MasterPolicy
from services.master.placement import FAILED_PORTS_REMEMBERED, placement_failures
from tests.services.master.test_core import Cluster
from tests.services.master.test_placement_retry import RETRY, _fail_newest, _retry  # pyright: ignore[reportPrivateUsage]

BASE = MasterPolicy().ring_base_port


def _placements(c: Cluster) -> list[InstancePlaced]:
    return [e for e in c.decided if isinstance(e, InstancePlaced)]


def _ports(placed: InstancePlaced) -> list[int]:
    return [int(host_port.rpartition(":")[2]) for host_port in placed.ring_hosts]


def _waiting_cluster() -> Cluster:
    """Two nodes on one host (127.0.0.1) and the default model: it is placed, and placed again after
    each failure once the backoff is over (refused or not: nothing needs to wait for it)."""
    c = Cluster(MasterPolicy(placement_retry=RETRY, models=("tiny",), place_after_nodes=2))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    return c


def _fail_and_retry(c: Cluster) -> InstancePlaced:
    _fail_newest(c)
    c.clock.advance(400)  # past any backoff
    placed = [e for e in _retry(c) if isinstance(e, InstancePlaced)]
    assert len(placed) == 1, placed
    return placed[0]


def test_the_retry_of_a_placement_that_never_got_ready_takes_other_ports() -> None:
    c = _waiting_cluster()
    assert _ports(_placements(c)[-1]) == [BASE, BASE + 1]
    assert _ports(_fail_and_retry(c)) == [BASE + 2, BASE + 3]
    assert _ports(_fail_and_retry(c)) == [BASE + 4, BASE + 5]


def test_a_ready_placement_ends_the_streak_and_the_base_is_taken_again() -> None:
    c = _waiting_cluster()
    third = _fail_and_retry(c)
    third = _fail_and_retry(c)
    c.feed(c.ev.runner(0, "ready", third.instance_id), c.ev.runner(1, "ready", third.instance_id))
    assert c.state.instances[third.instance_id].became_ready_at
    _fail_newest(c)  # it fails after it was ready: not a failed placement
    assert placement_failures(c.state, "tiny").count == 0
    assert _ports(_placements(c)[-1]) == [BASE, BASE + 1]  # placed again at once, from the base


def test_ports_stay_within_the_remembered_failures_of_the_base() -> None:
    c = _waiting_cluster()
    highest = max(max(_ports(_fail_and_retry(c))) for _ in range(3 * FAILED_PORTS_REMEMBERED))
    assert highest < BASE + 2 * (FAILED_PORTS_REMEMBERED + 1)  # two ranks per placement, one host
