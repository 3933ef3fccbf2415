"""Table tests for the master core: placement, assignment order, failures, restarts, watchdog."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from events.apply import apply
from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    NodeTimedOut,
    RunnerStatusChanged,
    TaskAssigned,
    TaskCancelled,
    TaskCompleted,
    TaskFailed,
    TaskStalled,
)
from events.fold import fold
from events.ids import InstanceId, TaskId
from events.runner_detail import exit_detail
from events.runner_settings import RunnerSettings
from events.state import State
from events.vocabulary import RunnerStatusCause
from services.master.capacity import ModelFacts
from services.master.core import MasterCore, MasterPolicy, ModelCatalog, UnknownModel
from services.master.placement import NodeCount, RetryClock
from services.master.watchdog import Liveness, tick
from tests.events.builders import Events, FakeClock, fake_stamper

TINY_FACTS = ModelFacts(layers=8, weight_bytes=64 << 20)


class Catalog:
    def facts_of(self, model: str) -> ModelFacts:
        if model != "tiny":
            raise UnknownModel(f"unknown model {model!r}; known models: tiny")
        return TINY_FACTS


PIPELINE = NodeCount(least=2)


def pipelined(policy: MasterPolicy) -> MasterPolicy:
    """These tables were written for an instance split over two nodes (n1, n2), where a rank of the
    pipeline can fail alone: they keep that shape unless a test asks for another. Placement's own
    choice of nodes is tested in test_placement_memory.py."""
    if policy.nodes_per_instance != NodeCount():
        return policy
    return msgspec.structs.replace(policy, nodes_per_instance=PIPELINE)


class Cluster:
    """Folds events like the master shell does and feeds every event to the core."""

    def __init__(
        self, policy: MasterPolicy | None = None, catalog: ModelCatalog | None = None, *, pipeline: bool = True
    ) -> None:
        self.clock = FakeClock()
        self.ev = Events(self.clock)
        self.policy = pipelined(policy or MasterPolicy()) if pipeline else policy or MasterPolicy()
        self.core = MasterCore(self.policy, catalog or Catalog(), fake_stamper("master", self.clock))
        self.state = State()
        self.decided: list[LogEvent] = []
        self.stored_ids: set[str] = set()
        self.retry_clock = RetryClock()  # observed after every fold: a tick right after each event

    def retry_placements(self) -> list[LogEvent]:
        """The tick's retry of failed placements, by the backoff as `retry_clock` saw it."""
        return self.core.retry_placements(self.state, self.retry_clock.observe(self.state, self.clock.mono() / 1e9))

    def feed(self, *events: LogEvent, echo: bool = True) -> list[LogEvent]:
        """Append events; with `echo`, the master's decisions are appended too, like the log would.

        Like the shell, a batch of the master's own decisions is folded whole before it decides on
        any of them (it waits for the last one's seq), then on each in order. Like JetStream with
        Nats-Msg-Id, an event whose id is already stored is dropped."""
        out: list[LogEvent] = []
        for event in events:
            out += self._decide_on([event], echo)
        self.decided += out
        return out

    def feed_own(self, decisions: Sequence[LogEvent]) -> list[LogEvent]:
        """The master's own batch of decisions (a tick's): folded whole, then decided on."""
        out = self._decide_on(list(decisions), echo=True)
        self.decided += out
        return out

    def _decide_on(self, batch: list[LogEvent], echo: bool) -> list[LogEvent]:
        stored = [event for event in batch if event.env.event_id not in self.stored_ids]
        for event in stored:
            self.stored_ids.add(event.env.event_id)
            self.ev.learn(event)
            self.state = apply(self.state, self.state.last_seq + 1, event)
        self.retry_clock.observe(self.state, self.clock.mono() / 1e9)
        out: list[LogEvent] = []
        for event in stored:
            decisions = self.core.decide(self.state, event)
            out += decisions
            if echo and decisions:
                out += self._decide_on(decisions, echo)
        return out

    def ready_instance(self, nodes: Sequence[str] = ("n1", "n2")) -> str:
        self.feed(*(self.ev.node(n) for n in nodes))
        self.feed(self.ev.created("warm"))
        instance = next(e for e in self.decided if isinstance(e, InstancePlaced))
        self.feed(*(self.ev.runner(s.rank, "ready", instance.instance_id) for s in instance.shards))
        return instance.instance_id


def _kinds(events: Sequence[LogEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


def test_first_task_places_then_assigns_once_ready() -> None:
    c = Cluster()
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    placed = c.feed(c.ev.created("t1"))
    assert _kinds(placed) == ["InstancePlaced"]
    instance = placed[0]
    assert isinstance(instance, InstancePlaced) and len(instance.shards) == 2
    assert c.feed(c.ev.created("t2")) == []  # still loading: wait, don't place twice
    assert c.feed(c.ev.runner(0, "ready", instance.instance_id)) == []
    assigned = c.feed(c.ev.runner(1, "ready", instance.instance_id))
    assert [(e.task_id, e.instance_id) for e in assigned if isinstance(e, TaskAssigned)] == [
        ("t1", instance.instance_id),
        ("t2", instance.instance_id),
    ]


def test_an_instance_is_placed_with_the_policys_runner_settings_and_folded_with_them() -> None:
    settings = RunnerSettings(prefill_step_size=64, kv_bits=8, stall_stack_seconds=3.0)
    c = Cluster(MasterPolicy(runner_settings=settings))
    c.feed(c.ev.node("n1"))
    placed = c.feed(c.ev.created("t1"))
    assert isinstance(placed[0], InstancePlaced) and placed[0].settings == settings
    assert c.state.instances[placed[0].instance_id].settings == settings


def test_assignment_prefers_the_instance_with_fewest_queued() -> None:
    c = Cluster(MasterPolicy(nodes_per_instance=NodeCount(least=1, most=1)))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    first = c.ready_instance(nodes=())
    # a second instance on demand: force one by placing manually
    c.feed(c.ev.placed("manual", nodes=("n2",)), c.ev.runner(0, "ready", "manual"))
    out = c.feed(c.ev.created("a"), c.ev.created("b"), c.ev.created("c"))
    targets = [e.instance_id for e in out if isinstance(e, TaskAssigned)]
    assert targets[0] != targets[1] and sorted({first, "manual"}) == sorted(set(targets))


def test_unknown_model_fails_the_task_naming_known_models() -> None:
    c = Cluster()
    c.feed(c.ev.node("n1"))
    out = c.feed(c.ev.created("t1", model="gpt-9"))
    assert _kinds(out) == ["TaskFailed"]
    assert isinstance(out[0], TaskFailed) and "known models: tiny" in out[0].error


def test_no_nodes_fails_with_what_to_do() -> None:
    c = Cluster()
    out = c.feed(c.ev.created("t1"))
    assert isinstance(out[0], TaskFailed) and "shoal worker" in out[0].error


def test_cancel_before_assignment_completes_as_cancelled() -> None:
    c = Cluster()
    c.feed(c.ev.node("n1"))
    c.feed(c.ev.created("t1"))
    out = c.feed(TaskCancelled(env=c.ev.api.stamp(), task_id=TaskId("t1"), reason="client_disconnect"))
    assert isinstance(out[0], TaskCompleted) and out[0].finish_reason == "cancelled"
    assert c.state.tasks["t1"].status == "cancelled"


def test_runner_failure_retires_fails_queue_and_replaces() -> None:
    c = Cluster()
    instance = c.ready_instance()
    c.feed(c.ev.created("t1"))
    out = c.feed(c.ev.runner(1, "failed", instance))
    kinds = _kinds(out)
    assert kinds[:3] == ["InstanceRetired", "TaskFailed", "TaskFailed"]  # warm and t1 were queued
    failed = [e for e in out if isinstance(e, TaskFailed)]
    assert all(e.rank == 1 for e in failed)
    assert c.state.instances[instance].retired and c.state.tasks["t1"].status == "failed"
    # nothing waits and there is no default model: no re-placement until a task needs it
    assert "InstancePlaced" not in kinds
    replaced = c.feed(c.ev.created("t2"))
    assert _kinds(replaced) == ["InstancePlaced"] and replaced[0].instance_id != instance  # pyright: ignore[reportAttributeAccessIssue]


def test_an_assignment_stored_after_its_instance_was_retired_fails_the_task_naming_the_retirement() -> None:
    """The master decided t1's assignment on a State without its own retirement of that instance,
    still on its way to the log (or another master decided it): stored after the retirement, it
    names an instance whose ranks are gone. Nothing else would ever end t1 (a chaos run's task
    hung until its client gave up), so the task fails, saying why."""
    c = Cluster()
    instance = c.ready_instance()
    (stale,) = [e for e in c.feed(c.ev.created("t1"), echo=False) if isinstance(e, TaskAssigned)]
    assert stale.instance_id == instance
    retired = c.feed(c.ev.runner(1, "failed", instance))
    assert "InstanceRetired" in _kinds(retired) and c.state.tasks[TaskId("t1")].instance_id is None
    out = c.feed(stale)
    failed = [e for e in out if isinstance(e, TaskFailed) and e.task_id == "t1"]
    assert len(failed) == 1 and f"instance {instance} was retired" in failed[0].error, out
    assert c.state.tasks[TaskId("t1")].status == "failed"


def test_node_timeout_retires_its_instances() -> None:
    c = Cluster()
    instance = c.ready_instance()
    c.feed(c.ev.created("t1"))
    out = c.feed(
        NodeTimedOut(env=c.ev.master.stamp(), node_id=c.state.instances[instance].shards[1].node_id, last_seen=0)
    )
    assert isinstance(out[0], InstanceRetired) and "timed out" in out[0].reason


def test_default_model_is_placed_when_enough_nodes_joined() -> None:
    c = Cluster(MasterPolicy(models=("tiny",), place_after_nodes=2))
    assert c.feed(c.ev.node("n1")) == []
    out = c.feed(c.ev.node("n2"))
    assert _kinds(out) == ["InstancePlaced"]
    assert c.feed(c.ev.node("n3")) == []  # already placed


def test_restart_reconcile_decides_nothing_twice() -> None:
    c = Cluster()
    instance = c.ready_instance()
    c.feed(c.ev.created("t1"))
    # a fresh master over the same log owes nothing
    fresh = MasterCore(c.policy, Catalog(), fake_stamper("master"))
    assert fresh.reconcile(c.state) == []
    # a task created while no master ran is assigned by reconcile, exactly once
    c.feed(c.ev.created("t2"), echo=False)
    del c.decided[:]
    out = fresh.reconcile(c.state)
    assert [(type(e).__name__, getattr(e, "task_id", "")) for e in out] == [("TaskAssigned", "t2")]
    assert isinstance(out[0], TaskAssigned) and out[0].instance_id == instance


def test_stale_decisions_carry_the_same_event_id() -> None:
    c = Cluster()
    c.feed(c.ev.node("n1"))
    state = fold(enumerate([c.ev.node("n1"), c.ev.created("t1")], start=1))
    a = c.core.decide(state, c.ev.created("t1"))
    b = c.core.decide(state, c.ev.created("t1"))
    assert a[0].env.event_id == b[0].env.event_id


@pytest.mark.parametrize("silent_seconds", [5.0, 31.0])
def test_watchdog_stalls_the_head_task_with_positions(silent_seconds: float) -> None:
    c = Cluster(MasterPolicy(task_stall_seconds=30.0))
    instance = c.ready_instance()
    c.feed(
        c.ev.started("warm", 0), c.ev.progress("warm", rank=0, iteration=3), c.ev.progress("warm", rank=1, iteration=2)
    )
    c.clock.advance(silent_seconds)
    out = tick(c.state, c.clock.now_ns, Liveness(), c.policy, fake_stamper("master", c.clock))
    stalls = [e for e in out if isinstance(e, TaskStalled | TaskFailed)]
    if silent_seconds < 30:
        assert stalls == []
        return
    assert _kinds(stalls) == ["TaskStalled", "TaskFailed"]
    stalled = stalls[0]
    assert isinstance(stalled, TaskStalled) and "rank 0" in stalled.diagnosis and "iteration 2" in stalled.diagnosis
    assert isinstance(stalls[1], TaskFailed) and stalls[1].rank == 1
    retired = [e for e in out if isinstance(e, InstanceRetired)]
    assert [e.instance_id for e in retired] == [instance] and "rank 1" in retired[0].reason
    assert c.state.instances[instance].queue[0] == "warm"


def test_watchdog_times_out_silent_nodes() -> None:
    c = Cluster(MasterPolicy(node_timeout_seconds=10.0))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    seen = {"n1": c.clock.now_ns, "n2": c.clock.now_ns}  # both heard when they joined
    c.clock.advance(8)
    seen["n1"] = c.clock.now_ns
    c.clock.advance(5)
    out = tick(c.state, c.clock.now_ns, Liveness(nodes=seen), c.policy, fake_stamper("master", c.clock))  # pyright: ignore[reportArgumentType]
    assert [e.node_id for e in out if isinstance(e, NodeTimedOut)] == ["n2"]


def test_watchdog_fails_tasks_nobody_serves() -> None:
    c = Cluster(MasterPolicy(assign_timeout_seconds=60))
    c.feed(c.ev.node("n1"))
    c.feed(c.ev.created("t1"))  # placed, never ready
    c.clock.advance(61)
    out = tick(
        c.state, c.clock.now_ns, Liveness(nodes={"n1": c.clock.now_ns}), c.policy, fake_stamper("master", c.clock)
    )  # pyright: ignore[reportArgumentType]
    assert [type(e).__name__ for e in out] == ["TaskFailed"] and "within 60s" in out[0].error  # pyright: ignore[reportAttributeAccessIssue]


def test_watchdog_names_the_rank_whose_heartbeats_stopped() -> None:
    c = Cluster(MasterPolicy(task_stall_seconds=30.0, node_timeout_seconds=10.0))
    instance = c.ready_instance()
    c.feed(
        c.ev.started("warm", 0), c.ev.progress("warm", rank=0, iteration=0), c.ev.progress("warm", rank=1, iteration=0)
    )
    frozen = c.ev.heartbeat(instance, 1, "prefill", "warm")
    c.clock.advance(31)
    alive = c.ev.heartbeat(instance, 0, "prefill", "warm")
    liveness = Liveness(runners={(alive.instance_id, 0): alive, (frozen.instance_id, 1): frozen})
    out = tick(c.state, c.clock.now_ns, liveness, c.policy, fake_stamper("master", c.clock))
    failed = [e for e in out if isinstance(e, TaskFailed)]
    assert failed[0].rank == 1


def _failed(c: Cluster, instance: str, rank: int, detail: str, cause: RunnerStatusCause) -> RunnerStatusChanged:
    return RunnerStatusChanged(
        env=c.ev.rank(instance, rank).stamp(),
        instance_id=InstanceId(instance),
        rank=rank,
        status="failed",
        detail=detail,
        cause=cause,
    )


def test_a_casualty_of_a_lost_peer_waits_for_the_rank_that_died() -> None:
    c = Cluster()
    instance = c.ready_instance()
    c.feed(c.ev.created("t1"))
    assert c.feed(_failed(c, instance, 0, "the ring group broke", "peer_lost")) == []
    out = c.feed(_failed(c, instance, 1, "runner process killed by SIGKILL", "killed"))
    retired = [e for e in out if isinstance(e, InstanceRetired)]
    assert retired and "rank 1" in retired[0].reason and "SIGKILL" in retired[0].reason
    assert {e.rank for e in out if isinstance(e, TaskFailed)} == {1}


def test_a_failed_task_names_the_rank_and_the_exit_but_not_the_runners_stderr() -> None:
    """What a runner last logged (other tasks' ids, a traceback) is for operators (`shoal diagnose`
    reads the runner's own event); the tasks' errors, which the API's clients read, stop before it."""
    c = Cluster()
    instance = c.ready_instance()
    c.feed(c.ev.created("t1"))
    stderr = "INFO task task_of_someone_else ended\nTraceback (most recent call last): ..."
    out = c.feed(_failed(c, instance, 1, exit_detail("runner process killed by SIGKILL", stderr), "killed"))
    errors = [e.error for e in out if isinstance(e, TaskFailed)]
    assert errors and all(e.endswith("rank 1 on node n2 failed: runner process killed by SIGKILL") for e in errors)
    assert not any("task_of_someone_else" in e or "Traceback" in e for e in errors)
    assert c.state.instances[instance].runners[1].detail.endswith(stderr)  # kept for the operators


def test_only_casualties_are_retired_after_the_grace() -> None:
    c = Cluster(MasterPolicy(peer_loss_grace_seconds=2.0))
    instance = c.ready_instance()
    assert c.feed(_failed(c, instance, 0, "the ring group broke", "peer_lost")) == []
    c.clock.advance(1)
    assert tick(c.state, c.clock.now_ns, Liveness(), c.policy, fake_stamper("master", c.clock)) == []
    c.clock.advance(2)
    out = tick(c.state, c.clock.now_ns, Liveness(), c.policy, fake_stamper("master", c.clock))
    retired = [e for e in out if isinstance(e, InstanceRetired)]
    assert retired and "rank(s) [1] never reported" in retired[0].reason
    assert {e.rank for e in out if isinstance(e, TaskFailed)} == {1}


def test_watchdog_sees_a_batch_alive_while_any_of_its_streams_moves_and_fails_it_all_when_none_does() -> None:
    """Under continuous batching the first `max_batch` tasks of the queue run together: the head may
    sit quiet while a batch-mate decodes, but once none moves for the stall deadline (a frozen rank
    stops them all) every queued task fails. A task still waiting for a slot postpones nothing."""
    c = Cluster(MasterPolicy(task_stall_seconds=30.0))
    instance = c.ready_instance()
    c.feed(c.ev.created("t2"), c.ev.created("t3"))
    c.feed(c.ev.started("warm", 0), c.ev.started("t2", 0))
    c.clock.advance(20)
    c.feed(c.ev.chunk("t2"))  # the head is quiet, its batch-mate decodes
    c.clock.advance(20)

    def stalls() -> list[TaskStalled | TaskFailed]:
        out = tick(c.state, c.clock.now_ns, Liveness(), c.policy, fake_stamper("master", c.clock))
        return [e for e in out if isinstance(e, TaskStalled | TaskFailed)]

    assert c.state.instances[InstanceId(instance)].queue == ("warm", "t2", "t3")
    assert stalls() == []
    c.clock.advance(11)
    c.feed(c.ev.created("t4"))  # assigned just now, not started: no sign of life
    out = stalls()
    assert _kinds(out) == ["TaskStalled", "TaskFailed", "TaskFailed", "TaskFailed", "TaskFailed"]
    assert [e.task_id for e in out] == ["warm", "warm", "t2", "t3", "t4"]
