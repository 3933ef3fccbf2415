"""The master's orchestration rules, table-tested through the pure core: several models, placement
on the fewest nodes that hold a model, hosts shared by several nodes, keep-alive, eviction, an
operator's load and unload, nodes that come and go (docs/ARCHITECTURE.md §5, services/master/
lifecycle.py)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    ModelLoadRequested,
    ModelUnavailable,
    ModelUnloadRequested,
    NodeLeft,
    Origin,
    PlacementHints,
    TaskAssigned,
    TaskCompleted,
    TaskFailed,
)
from events.ids import NodeId, TaskId
from events.origins import OPERATOR
from events.stamp import Stamper
from services.master.capacity import GIB, ModelFacts, rooms
from services.master.core import MasterPolicy, UnknownModel
from services.master.lifecycle import IdleClock, WaitClock
from services.master.placement import NodeCount
from tests.services.master.test_core import Cluster


class Sized:
    """Models of given weight sizes, 8 layers each."""

    def __init__(self, **gib: float) -> None:
        self.sizes = {name: int(size * GIB) for name, size in gib.items()}

    def facts_of(self, model: str) -> ModelFacts:
        if model not in self.sizes:
            raise UnknownModel(f"unknown model {model!r}")
        return ModelFacts(layers=8, weight_bytes=self.sizes[model])


def cluster(policy: MasterPolicy | None = None, **gib: float) -> Cluster:
    """Placement's own choice of nodes (not the 2-node pipeline of the other tables)."""
    return Cluster(policy, Sized(**gib), pipeline=False)


def placed(events: Sequence[LogEvent]) -> list[InstancePlaced]:
    return [e for e in events if isinstance(e, InstancePlaced)]


def retired(events: Sequence[LogEvent]) -> list[InstanceRetired]:
    return [e for e in events if isinstance(e, InstanceRetired)]


def ready(c: Cluster, instance: InstancePlaced) -> None:
    c.feed(*(c.ev.runner(s.rank, "ready", instance.instance_id) for s in instance.shards))


def complete(c: Cluster, task_id: str) -> list[LogEvent]:
    env = c.ev.task_rank(task_id).stamp()
    return c.feed(TaskCompleted(env=env, task_id=TaskId(task_id), finish_reason="stop"))


def nodes_of(instance: InstancePlaced) -> list[str]:
    return [s.node_id for s in instance.shards]


def assert_within_memory(c: Cluster) -> None:
    room = rooms(c.state)
    for node in room.nodes.values():
        assert node.reserved <= node.budget, node
    for host in room.hosts.values():
        assert host.reserved <= host.capacity, host


# --- placement chooses nodes -------------------------------------------------------------------


def test_a_model_that_fits_one_node_runs_on_one_node_the_one_with_most_room() -> None:
    c = cluster(small=1)
    c.feed(c.ev.node("n1", 4, host="h1"), c.ev.node("n2", 8, host="h2"))
    [instance] = placed(c.feed(c.ev.created("t1", model="small")))
    assert nodes_of(instance) == ["n2"] and "fewest nodes" in instance.reason


def test_a_model_too_big_for_any_node_is_split_over_the_fewest_that_hold_it() -> None:
    c = cluster(big=5)  # 6.25 GiB with its KV room
    c.feed(c.ev.node("n1", 4, host="h1"), c.ev.node("n2", 4, host="h2"), c.ev.node("n3", 2, host="h3"))
    [instance] = placed(c.feed(c.ev.created("t1", model="big")))
    assert sorted(nodes_of(instance)) == ["n1", "n2"]
    assert_within_memory(c)


def test_asked_for_more_nodes_it_splits_even_when_one_would_do() -> None:
    c = cluster(MasterPolicy(nodes_per_instance=NodeCount(least=2)), small=1)
    c.feed(c.ev.node("n1", 8, host="h1"), c.ev.node("n2", 8, host="h2"))
    [instance] = placed(c.feed(c.ev.created("t1", model="small")))
    assert sorted(nodes_of(instance)) == ["n1", "n2"] and "as asked" in instance.reason


def test_nodes_on_one_host_share_its_memory() -> None:
    """Two workers of one `shoal up` each announce the host's memory: together they hold no more."""
    c = cluster(a=5, b=5, c=9)  # 6.25 and 11.25 GiB with their KV room
    c.feed(c.ev.node("n1", 10, host="h"), c.ev.node("n2", 10, host="h"))
    [first] = placed(c.feed(c.ev.created("t1", model="a")))
    ready(c, first)
    out = c.feed(c.ev.created("t2", model="b"))
    assert placed(out) == [] and c.state.tasks[TaskId("t2")].status == "created"  # waits for a to finish
    [failed] = [e for e in c.feed(c.ev.created("t3", model="c")) if isinstance(e, TaskFailed)]
    assert "cannot fit" in failed.error and "unload a model" in failed.error  # not even with a gone
    assert_within_memory(c)


def test_a_model_bigger_than_the_cluster_fails_its_tasks_saying_why() -> None:
    c = cluster(huge=100)
    c.feed(c.ev.node("n1", 8, host="h1"), c.ev.node("n2", 8, host="h2"))
    [failed] = [e for e in c.feed(c.ev.created("t1", model="huge")) if isinstance(e, TaskFailed)]
    assert "cannot fit" in failed.error and "huge" in failed.error


# --- several models, kept placed ---------------------------------------------------------------


def test_configured_models_are_placed_one_after_another_each_seeing_the_memory_of_the_last() -> None:
    c = cluster(MasterPolicy(models=("a", "b", "c")), a=3, b=3, c=3)  # 3.75 GiB each
    out = c.feed(c.ev.node("n1", 8, host="h1"))
    assert [p.model for p in placed(out)] == ["a", "b"]
    [unavailable] = [e for e in out if isinstance(e, ModelUnavailable)]
    assert unavailable.model == "c" and "cannot fit" in unavailable.error
    assert_within_memory(c)
    out = c.feed(c.ev.node("n2", 8, host="h2"))  # a node joins: the model waiting for room goes there
    assert [(p.model, nodes_of(p)) for p in placed(out)] == [("c", ["n2"])]


def test_a_node_that_joins_takes_the_tasks_of_a_model_that_did_not_fit() -> None:
    c = cluster(a=6, b=6)
    c.feed(c.ev.node("n1", 8, host="h1"))
    [first] = placed(c.feed(c.ev.created("t1", model="a")))
    ready(c, first)
    c.feed(c.ev.created("t2", model="b"))  # a is busy with t1: b waits for room instead of failing
    assert c.state.tasks[TaskId("t2")].status == "created"
    [second] = placed(c.feed(c.ev.node("n2", 8, host="h2")))
    assert second.model == "b" and nodes_of(second) == ["n2"]


def test_a_node_that_leaves_retires_its_instance_and_the_model_is_placed_on_what_remains() -> None:
    c = cluster(MasterPolicy(models=("a",)), a=1)
    c.feed(c.ev.node("n1", 8, host="h1"), c.ev.node("n2", 4, host="h2"))
    [first] = placed(c.decided)
    assert nodes_of(first) == ["n1"]
    out = c.feed(NodeLeft(env=c.ev.worker("n1").stamp(), node_id=NodeId("n1"), reason="shutdown"))
    assert [r.cause for r in retired(out)] == ["node_gone"]
    assert [nodes_of(p) for p in placed(out)] == [["n2"]]


def test_a_revoked_node_retires_its_instance_and_its_tasks_fail_saying_so() -> None:
    c = cluster(a=1)
    c.feed(c.ev.node("n1", 8, host="h1"))
    [first] = placed(c.feed(c.ev.created("t1", model="a")))
    ready(c, first)
    revoked = Stamper(Origin(service=OPERATOR)).stamp()  # `shoal nats revoke-node`: the worker is cut off
    out = c.feed(NodeLeft(env=revoked, node_id=NodeId("n1"), reason="revoked by the operator"))
    assert [r.cause for r in retired(out)] == ["node_gone"]
    [failed] = [e for e in out if isinstance(e, TaskFailed)]
    assert failed.task_id == "t1" and "node n1 (rank 0) is left (revoked by the operator)" in failed.error


# --- idle instances: keep-alive and eviction ---------------------------------------------------


def _served_once(c: Cluster, model: str, task: str) -> InstancePlaced:
    [instance] = placed(c.feed(c.ev.created(task, model=model)))
    ready(c, instance)
    complete(c, task)
    return instance


def test_an_idle_instance_is_unloaded_after_its_keep_alive_and_a_request_places_it_again() -> None:
    c = cluster(MasterPolicy(models=("a",), model_keep_alive_seconds=60), a=1)
    c.feed(c.ev.node("n1", 8, host="h1"))
    [first] = placed(c.decided)
    ready(c, first)
    clock = IdleClock()
    assert clock.observe(c.state, now=0.0) == {first.instance_id: 0.0}
    assert c.core.unload_idle(c.state, clock.observe(c.state, now=59.0)) == []
    [unload] = c.core.unload_idle(c.state, clock.observe(c.state, now=60.0))
    assert isinstance(unload, InstanceRetired) and unload.cause == "idle"
    assert c.feed(unload) == []  # a model let go waits for a request, configured or not
    assert [p.model for p in placed(c.feed(c.ev.created("t1", model="a")))] == ["a"]


def test_activity_between_two_ticks_restarts_the_idle_time() -> None:
    c = cluster(MasterPolicy(model_keep_alive_seconds=60), a=1)
    c.feed(c.ev.node("n1", 8, host="h1"))
    instance = _served_once(c, "a", "t1")
    clock = IdleClock()
    clock.observe(c.state, now=0.0)
    c.feed(c.ev.created("t2", model="a"))
    complete(c, "t2")  # served between the ticks: the next tick sees it idle, but idle anew
    assert clock.observe(c.state, now=59.0) == {instance.instance_id: 0.0}


def test_keep_alive_zero_unloads_at_once_negative_never_and_a_pinned_model_stays() -> None:
    for keep_alive, unloaded in ((0.0, True), (-1.0, False)):
        c = cluster(MasterPolicy(model_keep_alive_seconds=keep_alive), a=1)
        c.feed(c.ev.node("n1", 8, host="h1"))
        instance = _served_once(c, "a", "t1")
        decisions = c.core.unload_idle(c.state, {instance.instance_id: 0.0})
        assert bool(retired(decisions)) is unloaded
    c = cluster(MasterPolicy(model_keep_alive_seconds=0), a=1)
    c.feed(c.ev.node("n1", 8, host="h1"))
    [pinned] = placed(c.feed(ModelLoadRequested(env=c.ev.api.stamp(), model="a", pinned=True)))
    ready(c, pinned)
    assert c.core.unload_idle(c.state, {pinned.instance_id: 1e9}) == []


def test_a_busy_instance_is_never_unloaded() -> None:
    c = cluster(MasterPolicy(model_keep_alive_seconds=0), a=1)
    c.feed(c.ev.node("n1", 8, host="h1"))
    [instance] = placed(c.feed(c.ev.created("t1", model="a")))
    ready(c, instance)
    assert c.core.unload_idle(c.state, {instance.instance_id: 1e9}) == []


def test_a_model_that_needs_room_evicts_the_least_recently_used_idle_instance() -> None:
    c = cluster(a=3, b=3, c=3)  # 3.75 GiB each; the node holds two
    c.feed(c.ev.node("n1", 8, host="h1"))
    a = _served_once(c, "a", "t1")
    b = _served_once(c, "b", "t2")
    c.feed(c.ev.created("t4", model="a"))  # a was used last now
    complete(c, "t4")
    out = c.feed(c.ev.created("t5", model="c"))
    assert [(r.instance_id, r.cause) for r in retired(out)] == [(b.instance_id, "evicted")]
    assert [p.model for p in placed(out)] == ["c"] and a.instance_id in c.state.instances
    assert not c.state.instances[a.instance_id].retired
    assert_within_memory(c)


def test_a_busy_instance_is_never_evicted_the_new_model_waits_for_it() -> None:
    c = cluster(a=5, b=5)
    c.feed(c.ev.node("n1", 8, host="h1"))
    [a] = placed(c.feed(c.ev.created("t1", model="a")))
    ready(c, a)  # t1 is assigned and running
    out = c.feed(c.ev.created("t2", model="b"))
    assert retired(out) == [] and placed(out) == []
    assert c.state.tasks[TaskId("t2")].status == "created"  # waits, not failed
    complete(c, "t1")  # a is idle now: the tick evicts it for b
    out = c.retry_placements()
    assert [r.cause for r in retired(out)] == ["evicted"] and [p.model for p in placed(out)] == ["b"]
    c.feed(*out)
    assert_within_memory(c)


# --- an operator's word ------------------------------------------------------------------------


def test_load_places_with_the_operators_hints() -> None:
    c = cluster(a=1)
    c.feed(c.ev.node("n1", 8, host="h1"), c.ev.node("n2", 8, host="h2"), c.ev.node("n3", 8, host="h3"))
    hints = PlacementHints(nodes=[NodeId("n2"), NodeId("n3")], min_nodes=2)
    [instance] = placed(c.feed(ModelLoadRequested(env=c.ev.api.stamp(), model="a", hints=hints)))
    assert sorted(nodes_of(instance)) == ["n2", "n3"]


def test_unload_lets_running_tasks_finish_then_retires_and_a_new_request_places_it_again() -> None:
    c = cluster(a=1)
    c.feed(c.ev.node("n1", 8, host="h1"))
    [instance] = placed(c.feed(c.ev.created("t1", model="a")))
    ready(c, instance)
    assert retired(c.feed(ModelUnloadRequested(env=c.ev.api.stamp(), model="a"))) == []  # t1 still runs
    out = c.feed(c.ev.created("t2", model="a"))
    assert [e for e in out if isinstance(e, TaskAssigned)] == []  # not handed to an instance on its way out
    out = complete(c, "t1")
    assert [(r.instance_id, r.cause) for r in retired(out)] == [(instance.instance_id, "unloaded")]
    [again] = placed(out)  # t2 waited: the model is placed anew for it
    assert again.instance_id != instance.instance_id


def test_two_masters_deciding_on_one_state_take_the_same_decisions_with_the_same_ids() -> None:
    one, two = cluster(MasterPolicy(models=("a", "b")), a=3, b=3), cluster(MasterPolicy(models=("a", "b")), a=3, b=3)
    for c in (one, two):
        c.feed(c.ev.node("n1", 8, host="h1"), c.ev.node("n2", 8, host="h2"))
    assert [e.env.event_id for e in one.decided] == [e.env.event_id for e in two.decided]
    assert len({e.env.event_id for e in one.decided}) == len(one.decided)


def test_a_requests_keep_alive_sets_how_long_its_instance_stays_loaded() -> None:
    c = cluster(MasterPolicy(model_keep_alive_seconds=1800), a=1)
    c.feed(c.ev.node("n1", 8, host="h1"))
    asked = c.ev.created("t1", model="a")
    asked = msgspec.structs.replace(asked, params=msgspec.structs.replace(asked.params, keep_alive_seconds=5.0))
    [instance] = placed(c.feed(asked))
    ready(c, instance)
    complete(c, "t1")
    assert c.core.unload_idle(c.state, {instance.instance_id: 4.0}) == []
    [unload] = c.core.unload_idle(c.state, {instance.instance_id: 5.0})
    assert isinstance(unload, InstanceRetired) and "keep-alive 5s" in unload.reason


def test_a_model_whose_requests_wait_gets_a_replica_where_memory_allows_up_to_the_maximum() -> None:
    c = cluster(MasterPolicy(max_instances_per_model=2, replica_after_wait_seconds=5), a=1)
    c.feed(c.ev.node("n1", 2, host="h1"), c.ev.node("n2", 2, host="h2"))
    [first] = placed(c.feed(c.ev.created("t0", model="a")))
    ready(c, first)
    c.feed(*(c.ev.created(f"t{i}", model="a") for i in range(1, 12)))  # more than its places
    clock = WaitClock()
    assert clock.observe(c.state, now=0.0) == {"a": 0.0}
    assert c.core.grow_replicas(c.state, clock.observe(c.state, now=4.0)) == []
    [replica] = c.core.grow_replicas(c.state, clock.observe(c.state, now=5.0))
    assert isinstance(replica, InstancePlaced) and nodes_of(replica) == ["n2"] and "replica 2 of 2" in replica.reason
    c.feed_own([replica])
    ready(c, replica)
    assigned_to = {e.instance_id for e in c.decided if isinstance(e, TaskAssigned)}
    assert assigned_to == {first.instance_id, replica.instance_id}  # the waiting tasks go to both
    assert c.core.grow_replicas(c.state, {"a": 60.0}) == []  # at the maximum
    assert_within_memory(c)


def test_an_instance_split_for_lack_of_room_moves_to_a_bigger_node_that_joins_without_cutting_a_stream() -> None:
    c = cluster(a=1.5)  # 1.875 GiB with its KV room: no 1.5 GiB node holds it alone
    c.feed(c.ev.node("n1", 1.5, host="h1"), c.ev.node("n2", 1.5, host="h2"))
    [split] = placed(c.feed(c.ev.created("t1", model="a")))
    assert sorted(nodes_of(split)) == ["n1", "n2"]
    ready(c, split)  # t1 runs on it
    [moved] = placed(c.feed(c.ev.node("n3", 8, host="h3")))
    assert nodes_of(moved) == ["n3"] and moved.replaces == split.instance_id and "moves" in moved.reason
    out = c.feed(c.ev.created("t2", model="a"))  # the new one is still loading: the old one serves
    assert [e.instance_id for e in out if isinstance(e, TaskAssigned)] == [split.instance_id]
    ready(c, moved)
    out = c.feed(c.ev.created("t3", model="a"))
    assert [e.instance_id for e in out if isinstance(e, TaskAssigned)] == [moved.instance_id]
    assert not c.state.instances[split.instance_id].retired  # it still holds t1 and t2
    complete(c, "t1")
    assert not c.state.instances[split.instance_id].retired
    out = complete(c, "t2")
    assert [(r.instance_id, r.cause) for r in retired(out)] == [(split.instance_id, "moved")]
    assert_within_memory(c)
