"""Who is to blame for an ended task is judged by the log's order, not by comparing one host's
wall clock with another's (issue 46 item 3): the hang shapes whose verdict rests on what went
down when (a killed rank, a node gone, a node that left long after) keep their finding when any
one host's clock runs minutes ahead or behind; so do those that rest on a rank's silence, which
is measured on its peers' clocks."""

from __future__ import annotations

import msgspec
import pytest

from events.catalogue import Event
from events.codec import ExportRecord
from services.ops.offline import diagnose_scan
from services.ops.scan import scan
from tests.ops import scenarios
from tests.ops.scenarios import KILLED, PEER_LOST, LogBuilder, Scenario, master_decides

MINUTES = 60 * 10**9


def _skewed(records: list[ExportRecord], host: str, offset_ns: int) -> list[ExportRecord]:
    """The same log, with every event stamped on `host` ("master", or a node) shifted by `offset_ns`."""

    def on_host(event: Event) -> bool:
        origin = event.env.origin
        return origin.service == "master" if host == "master" else origin.node == host

    shifted: list[ExportRecord] = []
    for record in records:
        event = record.event
        if isinstance(event, Event) and on_host(event):
            env = msgspec.structs.replace(event.env, wall_time=event.env.wall_time + offset_ns)
            record = msgspec.structs.replace(record, event=msgspec.structs.replace(event, env=env))
        shifted.append(record)
    return shifted


def _verdict(records: list[ExportRecord]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(f.kind, f.cause, f.stuck_ranks) for f in diagnose_scan(scan(enumerate(records, 1))).findings]


def node_timed_out_after_the_peers_error() -> LogBuilder:
    """n2 died: rank 0 felt the loss first and failed the task; the master timed n2 out after."""
    log = scenarios.started(stop_after=3)
    log.failed("t1", f"rank 0 failed: {PEER_LOST}", rank=0)
    log.runner_status("i1", 0, "failed", PEER_LOST, cause="peer_lost")
    master_decides(log)  # a casualty alone: the master waits
    log.advance(8)
    log.node_timed_out("n2", log.now_ns - 10 * 10**9)
    master_decides(log)
    return log


def own_error(telemetry: bool = False) -> LogBuilder:
    """Rank 0 failed the task with an error of its own."""
    log = scenarios.started(telemetry=telemetry)
    log.advance(0.5)
    log.failed("t1", "prompt of 9000 tokens exceeds the context of 8192", rank=0)
    return log


def node_left_a_minute_after_an_own_error() -> LogBuilder:
    log = own_error()
    log.advance(60)
    log.node_left("n2")
    return log


def node_left_an_hour_after_an_own_error() -> LogBuilder:
    """The task failed by rank 0's own error; the instance idled; an hour later n2 left and the
    master retired the instance."""
    log = own_error()
    log.advance(3600)
    log.node_left("n2")
    master_decides(log)
    return log


def rank_killed_after_the_instance_served_on() -> LogBuilder:
    """A task failed on its own; another one ran on the same instance; then rank 1 was killed."""
    log = own_error()
    log.task_created("t2")
    log.task_assigned("t2", "i1")
    log.advance(1)
    log.runner_status("i1", 1, "failed", KILLED, cause="killed")
    return log


SHAPES: tuple[tuple[Scenario, tuple[str, str, tuple[int, ...]]], ...] = (
    (scenarios.killed_then_peer_failed, ("task", "rank_died", (1,))),
    (scenarios.peer_failed_before_kill_reported, ("task", "rank_died", (1,))),
    (scenarios.node_timed_out_then_back, ("task", "node_timed_out", (1,))),
    (node_left_a_minute_after_an_own_error, ("task", "rank_error", (0,))),
    (node_timed_out_after_the_peers_error, ("task", "node_timed_out", (1,))),
    (node_left_an_hour_after_an_own_error, ("task", "rank_error", (0,))),
    # A rank's silence, told on its peers' clocks (`Heartbeats.silences`):
    (scenarios.rank_error_then_shutdown, ("task", "rank_error", (0,))),
    (scenarios.failed_with_error, ("task", "rank_error", (0,))),
    (scenarios.watchdog_failed_after_silence, ("task", "rank_died", (1,))),
    (scenarios.frozen_rank_short_deadline, ("task", "rank_died", (1,))),
    (scenarios.sleeping_rank_short_deadline, ("task", "stalled_in_compute", (1,))),
    (scenarios.runner_failed, ("task", "rank_died", (1,))),
)


@pytest.mark.parametrize("host", ["master", "n1", "n2"])
@pytest.mark.parametrize("offset_min", [-10, -1, 1, 10, 70])
@pytest.mark.parametrize(("scenario", "expected"), SHAPES, ids=lambda x: getattr(x, "__name__", ""))
def test_a_host_minutes_off_changes_no_verdict(
    scenario: Scenario, expected: tuple[str, str, tuple[int, ...]], host: str, offset_min: int
) -> None:
    records = scenario().records
    assert _verdict(records)[0] == expected  # the shape itself, with every clock agreeing
    assert _verdict(_skewed(records, host, offset_min * MINUTES))[0] == expected


def test_a_kill_after_the_instance_served_another_task_is_not_the_earlier_tasks_story() -> None:
    findings = diagnose_scan(scan(enumerate(rank_killed_after_the_instance_served_on().records, 1))).findings
    by_task = {f.task_id: (f.cause, f.stuck_ranks) for f in findings}
    assert by_task == {"t1": ("rank_error", (0,)), "t2": ("rank_died", (1,))}
