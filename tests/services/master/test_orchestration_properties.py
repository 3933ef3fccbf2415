"""Properties of the master's orchestration, over random clusters and random schedules of
requests, readiness, completions, idle unloads, operators' loads and unloads and nodes that come
and go (services/master/lifecycle.py, placement.py):

- no node and no host is ever promised more memory than it has;
- an instance holding a task is retired only because it broke (its node left, a rank failed),
  never to make room, for idleness or by an operator's unload;
- a model whose tasks wait is placed once it fits on the nodes that are up;
- no task is assigned twice; replicas never exceed `max_instances_per_model`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from events.catalogue import (
    InstanceRetired,
    LogEvent,
    ModelLoadRequested,
    ModelUnloadRequested,
    NodeLeft,
    TaskAssigned,
)
from events.ids import NodeId
from events.state import InstanceInfo
from services.master.core import MasterPolicy
from services.master.lifecycle import idle_instances, waiting_models
from services.master.placement import NoRoom, plan_instance
from tests.services.master.test_core import Cluster
from tests.services.master.test_orchestration import Sized, assert_within_memory, complete

MODELS = {"a": 1.0, "b": 2.5, "c": 4.0, "d": 7.0}
BREAKS = frozenset({"node_gone", "runner_down", "stalled", "peer_lost", "load_deadline"})

node_specs = st.lists(
    st.tuples(st.sampled_from([2, 4, 6, 8]), st.sampled_from(["h1", "h2", "h3"])), min_size=1, max_size=4
)
actions = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.sampled_from(sorted(MODELS))),
        st.tuples(st.just("ready"), st.integers(0, 5)),
        st.tuples(st.just("complete"), st.integers(0, 20)),
        st.tuples(st.just("idle"), st.just("")),
        st.tuples(st.just("load"), st.sampled_from(sorted(MODELS))),
        st.tuples(st.just("unload"), st.sampled_from(sorted(MODELS))),
        st.tuples(st.just("leave"), st.integers(0, 3)),
        st.tuples(st.just("join"), st.integers(0, 3)),
        st.tuples(st.just("tick"), st.just("")),
        st.tuples(st.just("replica"), st.just("")),
    ),
    max_size=40,
)


class Run:
    def __init__(self, nodes: list[tuple[int, str]], keep_alive: float) -> None:
        policy = MasterPolicy(models=("a",), model_keep_alive_seconds=keep_alive, max_instances_per_model=2)
        self.c = Cluster(policy, Sized(**MODELS), pipeline=False)
        self.nodes = nodes
        self.tasks = 0
        for index, (gib, host) in enumerate(nodes):
            self.feed(self.c.ev.node(f"n{index}", gib, host=host))

    def feed(self, *events: LogEvent, own: bool = False) -> None:
        """Events from outside, or (`own`) a batch of the master's decisions from its tick."""
        before = {i.instance_id: i.queue for i in self.c.state.instances.values() if not i.retired}
        decided_from = len(self.c.decided)
        if own:
            self.c.feed_own(events)
            self.c.decided[decided_from:decided_from] = list(events)
        else:
            self.c.feed(*events)
        for decision in self.c.decided[decided_from:]:
            if isinstance(decision, InstanceRetired) and decision.cause not in BREAKS:
                assert not before.get(decision.instance_id), f"{decision} retired an instance holding tasks"
        assert_within_memory(self.c)

    def step(self, action: str, arg: object) -> None:
        c = self.c
        match action:
            case "request":
                self.tasks += 1
                self.feed(c.ev.created(f"t{self.tasks}", model=str(arg)))
            case "ready":
                loading = [i for i in c.state.instances.values() if not i.retired and not i.ready]
                if loading:
                    self.ready(loading[int(arg) % len(loading)])
            case "complete":
                running = [t for i in c.state.instances.values() if i.ready for t in i.queue]
                if running:
                    self.feed_complete(running[int(arg) % len(running)])
            case "idle":
                idle = {i.instance_id: 1e9 for i in c.state.instances.values() if not i.retired}
                self.feed(*c.core.unload_idle(c.state, idle), own=True)
            case "load":
                self.feed(ModelLoadRequested(env=c.ev.api.stamp(), model=str(arg)))
            case "unload":
                self.feed(ModelUnloadRequested(env=c.ev.api.stamp(), model=str(arg)))
            case "leave":
                node = f"n{int(arg) % len(self.nodes)}"
                if c.state.nodes[NodeId(node)].status == "up":
                    self.feed(NodeLeft(env=c.ev.worker(node).stamp(), node_id=NodeId(node), reason="shutdown"))
            case "join":
                index = int(arg) % len(self.nodes)
                if c.state.nodes[NodeId(f"n{index}")].status != "up":
                    gib, host = self.nodes[index]
                    self.feed(c.ev.node(f"n{index}", gib, host=host))
            case "replica":
                waited = {model: 1e9 for model in waiting_models(c.state)}
                self.feed(*c.core.grow_replicas(c.state, waited), own=True)
            case _:
                c.clock.advance(1)
                self.feed(*c.retry_placements(), own=True)

    def ready(self, instance: InstanceInfo) -> None:
        self.feed(*(self.c.ev.runner(s.rank, "ready", instance.instance_id) for s in instance.shards))

    def feed_complete(self, task_id: str) -> None:
        decided_from = len(self.c.decided)
        complete(self.c, task_id)
        assert_within_memory(self.c)
        for decision in self.c.decided[decided_from:]:
            assert not (isinstance(decision, InstanceRetired) and decision.cause in BREAKS)

    def settle(self) -> None:
        """Every instance gets ready and the ticks run: what waits is placed where it can be."""
        for _ in range(6):
            for instance in [i for i in self.c.state.instances.values() if not i.retired and not i.ready]:
                self.ready(instance)
            self.c.clock.advance(600)  # past every placement backoff
            self.feed(*self.c.retry_placements(), own=True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=node_specs, schedule=actions, keep_alive=st.sampled_from([0.0, 60.0, -1.0]))
def test_orchestration_never_over_commits_never_drops_a_running_task_and_places_what_fits(
    nodes: list[tuple[int, str]], schedule: list[tuple[str, object]], keep_alive: float
) -> None:
    note(f"nodes {nodes}, keep-alive {keep_alive}, schedule {schedule}")
    run = Run(nodes, keep_alive)
    for action, arg in schedule:
        run.step(action, arg)
    run.settle()
    state = run.c.state
    assigned = [e.task_id for e in run.c.decided if isinstance(e, TaskAssigned)]
    assert len(assigned) == len(set(assigned)), "a task assigned twice"
    for model in MODELS:
        live = [i for i in state.instances.values() if i.model == model and not i.retired]
        assert len(live) <= 2, f"{model} has {len(live)} live instances, over max_instances_per_model"
    idle = {i.instance_id for i in idle_instances(state)}
    for model in sorted(waiting_models(state)):
        if any(i.model == model and not i.retired for i in state.instances.values()):
            continue  # served once its instance is ready, or placed anew once its draining one is gone
        try:
            plan_instance(state, run.c.core._request(state, model), without=idle)  # pyright: ignore[reportPrivateUsage]
        except NoRoom:
            continue  # busy instances hold the room it needs: it waits for them, never evicts them
        raise AssertionError(f"model {model!r} fits on the nodes up but its tasks still wait")
