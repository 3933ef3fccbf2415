"""Two masters deciding the same watchdog fact must derive the same event id, or JetStream's
de-duplication cannot store it once: their liveness differs (each hears heartbeats at its own
time, and counts a node from its own start), the log they fold does not."""

from __future__ import annotations

from events.catalogue import LogEvent, NodeTimedOut, TaskStalled
from events.ids import NodeId
from services.master.watchdog import NS, Liveness, tick
from tests.events.builders import fake_stamper
from tests.services.master.test_core import Cluster


def ticked(c: Cluster, master: str, last_seen: dict[NodeId, int]) -> list[LogEvent]:
    return tick(
        c.state, c.clock.now_ns, Liveness(nodes=last_seen), c.policy, fake_stamper("master", c.clock, node=master)
    )


def test_two_masters_with_different_last_seen_derive_one_timeout_id() -> None:
    c = Cluster()
    c.feed(c.ev.node("n1"))
    c.clock.advance(c.policy.node_timeout_seconds + 5)
    started = c.clock.now_ns - int((c.policy.node_timeout_seconds + 1) * NS)
    first = ticked(c, "master-a", {NodeId("n1"): started})
    second = ticked(c, "master-b", {NodeId("n1"): started - 2 * NS})  # started earlier, or heard it at another time
    assert [type(e) for e in first] == [type(e) for e in second] == [NodeTimedOut]
    assert first[0].env.event_id == second[0].env.event_id


def test_a_node_that_joins_again_can_time_out_again() -> None:
    """A node is judged from when this master first noticed it up (`hearing.Hearing.notice`)."""
    c = Cluster()
    c.feed(c.ev.node("n1"))
    noticed = c.clock.now_ns
    c.clock.advance(c.policy.node_timeout_seconds + 1)
    first = ticked(c, "master-a", {NodeId("n1"): noticed})
    c.feed(*first, c.ev.node("n1"))  # timed out, then back
    noticed_again = c.clock.now_ns
    c.clock.advance(c.policy.node_timeout_seconds + 1)
    again = ticked(c, "master-a", {NodeId("n1"): noticed_again})
    assert [type(e) for e in again] == [NodeTimedOut] and again[0].env.event_id != first[0].env.event_id


def test_two_masters_derive_one_stall_id() -> None:
    c = Cluster()
    instance = c.ready_instance()
    c.feed(c.ev.created("t1"))
    c.clock.advance(c.policy.task_stall_seconds + 1)
    first, second = ticked(c, "master-a", {}), ticked(c, "master-b", {})
    stalls = [e.env.event_id for e in [*first, *second] if isinstance(e, TaskStalled)]
    assert len(stalls) == 2 and stalls[0] == stalls[1], (instance, stalls)
    assert [e.env.event_id for e in first] == [e.env.event_id for e in second]
