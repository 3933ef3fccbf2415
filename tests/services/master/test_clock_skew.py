"""The watchdog's deadlines by the master's own clock: a master whose clock is minutes ahead of or
behind the API's and the ranks' (or a monotonic clock counting from its boot) neither fails a
task early nor never. Every other host stamps on the cluster's clock; the master ticks on its own."""

from __future__ import annotations

import pytest

from events.catalogue import (
    InstancePlaced,
    InstanceRetired,
    LogEvent,
    MasterProbe,
    NodeTimedOut,
    Origin,
    TaskCancelled,
    TaskCompleted,
    TaskFailed,
)
from events.ids import TaskId
from events.stamp import Stamper
from services.master.core import MasterPolicy
from services.master.hearing import Hearing
from services.master.watchdog import NS, describe_positions, tick
from tests.events.builders import FakeClock, fake_stamper
from tests.services.master.test_core import Cluster

MASTER = "m1"
BOOT_S = -1_700_000_000.0  # a monotonic clock: seconds since the master's boot, not since 1970
SKEWS_S = [-600.0, -120.0, 0.0, 120.0, 600.0, BOOT_S]


class SkewedMaster:
    """The master shell's tick, on a clock `skew_s` off the cluster's: probe, notice, watchdog."""

    def __init__(self, c: Cluster, skew_s: float) -> None:
        self.c = c
        self.skew_ns = int(skew_s * NS)
        self.hearing = Hearing(MASTER, 1.0)
        self.clock = FakeClock(c.clock.now_ns + self.skew_ns)
        self.probes = Stamper(Origin(service="master"), wall_ns=self.clock.wall, mono_ns=self.clock.mono)

    def now(self) -> int:
        return self.c.clock.now_ns + self.skew_ns

    def tick(self) -> list[LogEvent]:
        self.clock.now_ns = self.now()
        self.hearing.heard(MasterProbe(env=self.probes.stamp(), master=MASTER), self.now())
        self.hearing.notice(self.c.state, self.now(), wall_ns=self.c.clock.now_ns)
        liveness = self.hearing.liveness()
        return tick(self.c.state, self.now(), liveness, self.c.policy, fake_stamper("master", self.c.clock))

    def run(self, seconds: int) -> list[LogEvent]:
        """Tick once a second for `seconds`."""
        out: list[LogEvent] = []
        for _ in range(seconds):
            self.c.clock.advance(1)
            out += self.tick()
        return out


def ready(c: Cluster) -> None:
    """A ready instance, its warm-up task done."""
    c.ready_instance()
    c.feed(TaskCompleted(env=c.ev.task_rank("warm").stamp(), task_id=TaskId("warm"), finish_reason="stop"))


def failures(events: list[LogEvent]) -> list[tuple[str, bool]]:
    return [(e.task_id, e.deadline) for e in events if isinstance(e, TaskFailed)]


@pytest.mark.parametrize("skew_s", SKEWS_S)
def test_a_task_no_instance_serves_fails_at_its_assign_timeout_whatever_the_masters_clock(skew_s: float) -> None:
    c = Cluster(MasterPolicy(assign_timeout_seconds=60, request_timeout_seconds=0, node_timeout_seconds=600))
    master = SkewedMaster(c, skew_s)
    c.feed(c.ev.node("n1"), c.ev.created("t1"))  # placed, never ready
    assert failures(master.tick() + master.run(60)) == []
    assert failures(master.run(1)) == [("t1", False)]


@pytest.mark.parametrize("skew_s", SKEWS_S)
def test_a_running_task_meets_its_deadline_on_time_whatever_the_masters_clock(skew_s: float) -> None:
    c = Cluster(MasterPolicy(request_timeout_seconds=20, task_stall_seconds=300, node_timeout_seconds=600))
    ready(c)
    master = SkewedMaster(c, skew_s)
    c.feed(c.ev.created("t1"), c.ev.started("t1", 0), c.ev.progress("t1", rank=0))
    assert failures(master.tick() + master.run(20)) == []
    assert failures(master.run(1)) == [("t1", True)]


@pytest.mark.parametrize("skew_s", SKEWS_S)
def test_an_instance_that_shows_no_loading_progress_is_retired_on_time_whatever_the_masters_clock(
    skew_s: float,
) -> None:
    c = Cluster(MasterPolicy(instance_ready_timeout_seconds=30, assign_timeout_seconds=600, node_timeout_seconds=600))
    master = SkewedMaster(c, skew_s)
    c.feed(c.ev.node("n1"), c.ev.node("n2"), c.ev.created("t1"))
    placed = next(e for e in c.decided if isinstance(e, InstancePlaced))
    assert master.tick() + master.run(20) == []
    c.feed(c.ev.runner(0, "loading", placed.instance_id))  # a sign of loading: the count starts again
    assert master.tick() + master.run(30) == []
    retired = [e for e in master.run(1) if isinstance(e, InstanceRetired)]
    assert [e.instance_id for e in retired] == [placed.instance_id]


@pytest.mark.parametrize("skew_s", SKEWS_S)
def test_a_stalled_tasks_diagnosis_counts_its_ages_on_the_masters_clock(skew_s: float) -> None:
    c = Cluster(MasterPolicy(task_stall_seconds=300, node_timeout_seconds=600))
    ready(c)
    master = SkewedMaster(c, skew_s)
    c.feed(c.ev.created("t1"), c.ev.started("t1", 0), c.ev.progress("t1", rank=0))
    master.tick()
    c.clock.advance(4)
    c.feed(TaskCancelled(env=c.ev.api.stamp(), task_id=TaskId("t1"), reason="client_disconnect"))
    master.run(3)
    task = c.state.tasks[TaskId("t1")]
    instance = c.state.instances[task.instance_id] if task.instance_id else None
    assert instance is not None
    text = describe_positions(task, instance, master.hearing.liveness(), master.now())
    # the cancel was first seen on the tick a second after it was stored: one tick late, never early
    assert "7.0s ago" in text and "requested 2.0s ago" in text, text


def test_a_node_timeout_records_the_masters_wall_time_not_its_monotonic_one() -> None:
    c = Cluster(MasterPolicy(node_timeout_seconds=10))
    master = SkewedMaster(c, BOOT_S)
    c.feed(c.ev.node("n1"))
    master.tick()
    noticed_wall = c.clock.now_ns
    out = [e for e in master.run(11) if isinstance(e, NodeTimedOut)]
    assert [(e.node_id, e.last_seen) for e in out] == [("n1", noticed_wall)]
