"""Failed placements back off and are retried; stops never count; a model past its failures is
refused (and says so) until its next attempt; an instance that never gets ready is retired by the
loading deadline. Table tests over the master core and watchdog, on a fake clock."""

from __future__ import annotations

import msgspec
import pytest

from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    ModelDownloadProgress,
    NodeLeft,
    TaskFailed,
)
from events.ids import NodeId, TaskId
from events.vocabulary import RunnerStatusCause
from services.master.core import MasterCore, MasterPolicy
from services.master.placement import PlacementFailures, RetryPolicy, placement_failures
from services.master.watchdog import Liveness, tick
from services.models import model_error
from services.supervise import Backoff
from tests.events.builders import fake_stamper
from tests.services.master.test_core import Catalog, Cluster

T1 = TaskId("t1")
RETRY = RetryPolicy(backoff=Backoff(initial_seconds=2.0, max_seconds=10.0), refuse_after=3)


@pytest.mark.parametrize(
    ("failures", "seconds"), [(0, 0.0), (1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (40, 10.0), (10_000, 10.0)]
)
def test_retry_delay_doubles_up_to_its_cap(failures: int, seconds: float) -> None:
    assert RETRY.delay_ns(failures) == int(seconds * 1e9)


def test_due_and_refused() -> None:
    two = PlacementFailures(count=2)
    assert not RETRY.due(two, 3.9) and RETRY.due(two, 4.0)
    assert not RETRY.refused(two) and RETRY.refused(PlacementFailures(count=3))


def _fail_newest(c: Cluster, cause: RunnerStatusCause | None = "error") -> str:
    """The newest placement's rank 0 fails while loading; its id."""
    newest = max(c.state.instances.values(), key=lambda i: i.placed_seq).instance_id
    down = c.ev.runner(0, "stopped" if cause == "terminated" else "failed", newest)
    c.feed(msgspec.structs.replace(down, cause=cause))
    return newest


def _retry(c: Cluster) -> list[LogEvent]:
    decisions = c.retry_placements()
    c.feed(*decisions)
    return decisions


def _kinds(events: list[LogEvent]) -> list[str]:
    return [type(e).__name__ for e in events]


def test_a_failed_placement_is_retried_after_its_backoff_not_at_once() -> None:
    c = Cluster(MasterPolicy(placement_retry=RETRY))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    c.feed(c.ev.created("t1"))
    _fail_newest(c)
    assert _kinds(c.decided[-1:]) == ["InstanceRetired"]  # the task waits: no placement at once
    assert c.state.tasks[T1].status == "created"
    c.clock.advance(1.9)
    assert _retry(c) == []
    c.clock.advance(0.2)
    assert _kinds(_retry(c)) == ["InstancePlaced"]


def _failing(times: int) -> Cluster:
    """Two nodes, task t1 waiting, and `times` placements in a row that failed while loading
    (each retried once its backoff was over)."""
    c = Cluster(MasterPolicy(placement_retry=RETRY))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    c.feed(c.ev.created("t1"))
    for attempt in range(times):
        _fail_newest(c)
        if attempt < times - 1:
            c.clock.advance(10)
            _retry(c)
    return c


def test_after_three_failures_the_model_is_refused_and_says_so_then_retried() -> None:
    c = _failing(3)
    assert c.state.tasks[T1].status == "failed" and "refused" in c.state.tasks[T1].error
    assert "failed to load 3 times in a row" in model_error(c.state, "tiny")
    refused = c.feed(c.ev.created("t2"))
    assert _kinds(refused) == ["TaskFailed"] and "refused" in refused[0].error  # pyright: ignore[reportAttributeAccessIssue]
    c.clock.advance(8)  # the backoff after 3 failures is over: tried again, though nothing waits
    c.core.policy = MasterPolicy(placement_retry=RETRY, models=("tiny",), place_after_nodes=2)
    assert _kinds(_retry(c)) == ["InstancePlaced"]
    assert model_error(c.state, "tiny") == ""  # loading again: not refused


def test_ranks_told_to_stop_while_loading_never_count_as_failures() -> None:
    c = Cluster(MasterPolicy(placement_retry=RETRY))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    c.feed(c.ev.created("t1"))
    for _ in range(4):
        _fail_newest(c, "terminated")
        assert placement_failures(c.state, "tiny").count == 0
        assert _kinds(c.decided[-2:]) == ["InstanceRetired", "InstancePlaced"]  # placed again at once


def test_a_worker_that_shuts_down_while_loading_is_a_stop() -> None:
    c = Cluster(MasterPolicy(placement_retry=RETRY))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    c.feed(c.ev.created("t1"))
    for _ in range(3):  # `shoal up` stopped with Ctrl-C while loading, three times
        _fail_newest(c, "error")  # rank 0's accept, interrupted by the shutdown: "Accept failed (error: 4)"
        c.feed(NodeLeft(env=c.ev.worker("n2").stamp(), node_id=NodeId("n2"), reason="shutdown"))
        c.clock.advance(1)
        rejoined = c.feed(c.ev.node("n2"))  # the next `shoal up`
        assert placement_failures(c.state, "tiny").count == 0
        assert _kinds(rejoined) == ["InstancePlaced"]  # placed again at once for the waiting task
    assert model_error(c.state, "tiny") == ""
    assert c.state.tasks[T1].status == "created"


def test_a_joining_node_and_a_fresh_master_forgive_failures() -> None:
    c = _failing(3)
    assert placement_failures(c.state, "tiny").count == 3
    fresh = MasterCore(c.policy, Catalog(), fake_stamper("master", c.clock))
    fresh.reconcile(c.state)
    assert fresh.failures(c.state, "tiny").count == 0
    c.clock.advance(1)
    c.feed(c.ev.node("n3"))
    assert placement_failures(c.state, "tiny").count == 0
    placed = c.feed(c.ev.created("t2"))
    assert _kinds(placed) == ["InstancePlaced"]


def test_a_node_whose_clock_runs_ahead_forgives_nothing_by_its_clock() -> None:
    """Forgiveness follows the log's order: a worker's clock minutes ahead stamps its join "after"
    every later placement by the master's clock, and must not wipe out failures that came after it."""
    c = Cluster(MasterPolicy(placement_retry=RETRY))
    ahead = c.ev.node("n3")
    c.feed(
        msgspec.structs.replace(
            ahead, env=msgspec.structs.replace(ahead.env, wall_time=ahead.env.wall_time + 600 * 10**9)
        )
    )
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    c.feed(c.ev.created("t1"))
    _fail_newest(c)
    c.clock.advance(10)
    _retry(c)
    _fail_newest(c)
    assert placement_failures(c.state, "tiny").count == 2


def test_a_request_stamped_by_a_clock_ahead_does_not_cut_the_backoff_short() -> None:
    """A decision on an event reads no clock: a task created by an API whose clock runs minutes
    ahead waits for the tick, which judges the backoff by the master's own clock."""
    c = Cluster(MasterPolicy(placement_retry=RETRY))
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    c.feed(c.ev.created("t1"))
    _fail_newest(c)
    ahead = c.ev.created("t2")
    later = msgspec.structs.replace(ahead.env, wall_time=ahead.env.wall_time + 600 * 10**9)
    assert c.feed(msgspec.structs.replace(ahead, env=later)) == []
    c.clock.advance(1.9)
    assert _retry(c) == []
    c.clock.advance(0.1)
    assert _kinds(_retry(c)) == ["InstancePlaced"]


@pytest.mark.parametrize("skew_seconds", [-600, 600])
def test_a_node_whose_clock_is_off_neither_forgives_failures_nor_hides_its_join(skew_seconds: float) -> None:
    """Failures are counted after the newest join in the log's order, not by comparing the join's
    stamp (its worker's clock) with the placements' (the master's): a worker ten minutes ahead
    forgave every failure (the master retried at once, never refused); one behind hid its rejoin."""
    c = _failing(3)
    join = c.ev.node("n2")
    skewed = msgspec.structs.replace(join.env, wall_time=join.env.wall_time + int(skew_seconds * 1e9))
    c.feed(
        msgspec.structs.replace(join, env=skewed)
    )  # a re-announce: new capacity, so what failed before is forgiven either way
    assert placement_failures(c.state, "tiny").count == 0
    c.feed(c.ev.created("t2"))
    _fail_newest(c)
    assert placement_failures(c.state, "tiny").count == 1  # the failure after the join counts, whatever the clocks


def _loading(c: Cluster) -> str:
    c.feed(c.ev.node("n1"), c.ev.node("n2"))
    c.feed(c.ev.created("t1"))
    placed = [e for e in c.decided if isinstance(e, InstancePlaced)][-1]
    c.feed(c.ev.runner(0, "loading", placed.instance_id), c.ev.runner(1, "loading", placed.instance_id))
    c.feed(c.ev.runner(0, "ready", placed.instance_id))
    return placed.instance_id


def _heard(c: Cluster) -> Liveness:
    """Every node heard just now: only the loading deadline can decide anything."""
    return Liveness(nodes={node: c.clock.wall() for node in c.state.nodes})


def test_loading_deadline_retires_the_instance_and_fails_its_waiting_tasks() -> None:
    policy = MasterPolicy(instance_ready_timeout_seconds=60)
    c = Cluster(policy)
    _loading(c)
    c.clock.advance(59)
    assert tick(c.state, c.clock.wall(), _heard(c), policy, c.core.stamper) == []
    c.clock.advance(2)
    out = tick(c.state, c.clock.wall(), _heard(c), policy, c.core.stamper)
    retired, failed = out[0], out[1]
    assert isinstance(retired, InstanceRetired) and retired.cause == "load_deadline"
    assert "rank 1 on n2 still loading" in retired.reason and "rank 0" not in retired.reason
    assert isinstance(failed, TaskFailed) and failed.task_id == "t1" and "not ready within 60s" in failed.error
    c.feed(*out)
    assert placement_failures(c.state, "tiny").count == 1  # a deadline is the model's failure


def test_download_progress_postpones_the_loading_deadline() -> None:
    policy = MasterPolicy(instance_ready_timeout_seconds=60)
    c = Cluster(policy)
    _loading(c)
    c.clock.advance(50)
    progress = ModelDownloadProgress(
        env=c.ev.rank("x", 1).stamp(), node_id=NodeId("n2"), model="tiny", bytes_done=1, bytes_total=10
    )
    c.feed(progress)
    c.clock.advance(50)
    assert tick(c.state, c.clock.wall(), _heard(c), policy, c.core.stamper) == []
