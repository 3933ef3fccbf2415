"""Small logs, one per hang shape, built with `LogBuilder` (2 ranks unless said otherwise).

What the master decides in them (a stalled task given up, an instance retired) is never typed by
hand: the real master core and watchdog run on the log as it stands (`master_decides`,
`watchdog_ticks`). `CATALOGUE` lists every shape with the finding `shoal diagnose` must make.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from events.catalogue import LogEvent, Origin, RunnerHeartbeat
from events.codec import ExportRecord
from events.fold import fold
from events.runner_detail import exit_detail
from events.stamp import Stamper
from events.state import State
from events.vocabulary import RunnerStatus
from services.master.core import MasterCore, MasterPolicy
from services.master.watchdog import Liveness, RunnerKey, tick
from services.models import LocalModelCatalog
from services.ops.findings import Cause, SubjectKind
from services.ops.synthetic import (
    COLLECTIVE_STACK,
    COMPUTE_STACK,
    LogBuilder,
    PrefillPlan,
    simulate_decode,
    simulate_prefill,
)

NODES = ("n1", "n2")


def started(task: str = "t1", stop_after: int | None = None, chunks: int = 8, telemetry: bool = True) -> LogBuilder:
    """A ready 2-rank instance, one task created, assigned and prefilled (maybe wedged)."""
    log = LogBuilder()
    log.ready_instance("i1", NODES)
    log.advance(1)
    log.task_created(task)
    log.task_assigned(task, "i1")
    plan = PrefillPlan(
        task_id=task, instance_id="i1", world=2, chunks=chunks, stop_after_iteration=stop_after, heartbeats=telemetry
    )
    simulate_prefill(log, plan)
    return log


def beats(log: LogBuilder, seconds: int, phases: dict[int, tuple[str, int, str | None]], since: float = 0) -> None:
    """1 Hz heartbeats for `seconds`; phases: rank -> (phase, iteration, stack); stack after 5 s."""
    for second in range(seconds):
        log.advance(1)
        for rank, (phase, iteration, stack) in phases.items():
            age = since + second + 1
            log.heartbeat("i1", rank, phase, "t1", iteration, age, stack if age >= 5 else None)


def healthy() -> LogBuilder:
    log = started()
    simulate_decode(log, "t1", 20)
    log.completed("t1", tokens=20)
    return log


def runner_failed() -> LogBuilder:
    log = started(stop_after=3)
    log.runner_status("i1", 1, "failed", "exit code -9", cause="killed")
    beats(log, 40, {0: ("prefill", 3, COLLECTIVE_STACK)})
    return log


def heartbeat_silence() -> LogBuilder:
    log = started(stop_after=3)
    beats(log, 40, {0: ("prefill", 3, COLLECTIVE_STACK)})
    return log


def compute_stall() -> LogBuilder:
    log = started(stop_after=3)
    beats(log, 40, {0: ("prefill", 3, COLLECTIVE_STACK), 1: ("prefill", 3, COMPUTE_STACK)})
    return log


def collective_stall() -> LogBuilder:
    log = started(stop_after=3)
    beats(log, 40, {0: ("prefill", 3, COLLECTIVE_STACK), 1: ("prefill", 3, COLLECTIVE_STACK)})
    return log


def iteration_mismatch() -> LogBuilder:
    log = started(stop_after=2)
    for iteration in (3, 4, 5):  # rank 0 runs on alone, as if its sends were never matched
        log.advance(0.05)
        log.prefill_progress("t1", 0, (iteration + 1) * 256, 8 * 256 + 1, iteration)
    beats(log, 40, {0: ("prefill", 5, COLLECTIVE_STACK), 1: ("prefill", 2, COLLECTIVE_STACK)})
    return log


def cancel_split() -> LogBuilder:
    log = started(stop_after=3)
    log.cancelled("t1")
    beats(log, 40, {0: ("agree_cancel", 3, COLLECTIVE_STACK), 1: ("prefill", 3, COMPUTE_STACK)})
    return log


def cancel_no_telemetry() -> LogBuilder:
    log = started(stop_after=3, telemetry=False)
    log.cancelled("t1")
    log.advance(40)
    log.node_joined("n3")  # something else happens, so the log's end moves on
    return log


def node_timed_out() -> LogBuilder:
    log = started(stop_after=3)
    log.advance(40)
    log.node_timed_out("n2", log.now_ns - 35 * 10**9)
    return log


def node_timed_out_then_back() -> LogBuilder:
    """The node's timeout failed the task; the node came back before anyone diagnosed it."""
    log = node_timed_out()
    master_decides(log)
    log.advance(5)
    log.node_joined("n2")
    return log


def no_instance() -> LogBuilder:
    log = LogBuilder()
    log.node_joined("n1")
    log.task_created("t1", model="big")
    log.advance(60)
    log.node_joined("n2")
    return log


def _waiting_on_loading(rank0: RunnerStatus) -> LogBuilder:
    """Instance i1 placed on n1, n2: rank 0 `rank0`, rank 1 loading; task t1 waits for it."""
    log = LogBuilder()
    for node in NODES:
        log.node_joined(node)
    log.instance_placed("i1", NODES)
    log.runner_status("i1", 0, rank0)
    log.runner_status("i1", 1, "loading")
    log.task_created("t1")
    return log


def instance_loading() -> LogBuilder:
    log = _waiting_on_loading("ready")
    log.advance(60)
    log.node_joined("n3")
    return log


def frozen_while_loading() -> LogBuilder:
    """Rank 1 froze while loading (its heartbeats stop); rank 0 waits for it in the ring's
    set-up; a task waits for the model. The loading deadline (60 s here) gives up."""
    log = _waiting_on_loading("loading")
    for second in range(61):
        log.advance(1)
        log.heartbeat("i1", 0, "loading", None, 0, second + 1, None)
        if second < 3:
            log.heartbeat("i1", 1, "loading", None, 0, second + 1, None)
    watchdog_ticks(log, stall_s=30, ready_s=60)
    return log


def failed_with_error() -> LogBuilder:
    log = started()
    log.advance(0.5)
    log.failed("t1", "prompt of 9000 tokens exceeds the context of 8192", rank=0)
    return log


def quiet_no_telemetry() -> LogBuilder:
    log = started(stop_after=3, telemetry=False)
    log.advance(60)
    log.node_joined("n3")
    return log


def watchdog_failed_after_silence() -> LogBuilder:
    log = started(stop_after=3)
    beats(log, 5, {0: ("prefill", 3, None), 1: ("prefill", 3, None)})
    beats(log, 30, {0: ("prefill", 3, COLLECTIVE_STACK)}, since=5)
    watchdog_ticks(log, stall_s=30)
    return log


def idle_instance_rank_failed() -> LogBuilder:
    log = LogBuilder()
    log.ready_instance("i1", NODES)
    log.advance(5)
    log.runner_status("i1", 1, "failed", "segfault", cause="exited")
    return log


def node_gone_idle() -> LogBuilder:
    log = LogBuilder()
    log.ready_instance("i1", NODES)
    log.advance(30)
    log.node_timed_out("n2", log.now_ns - 25 * 10**9)
    return log


# --- shapes seen in real clusters (tests/e2e/test_hang_catalogue.py): what happens after the end ---

KILLED = exit_detail("runner process killed by SIGKILL", "Traceback (most recent call last): ...")
PEER_LOST = "RuntimeError: [ring] connection to a peer was lost"
SLEEP_STACK = (  # rank 1 under SHOAL_TEST_FAULT=sleep:1:...: asleep inside its cancel poll
    'File "runner/engine/task_run.py", line 56, in agree_to_stop\n'
    "    stop = self.collectives.any(poll and self.wants_stop())\n"
    'File "runner/engine/task_run.py", line 48, in wants_stop\n'
    "    return bool(self.cancel.is_cancelled(self.task_id))\n"
    'File "runner/flight/faults.py", line 119, in is_cancelled\n    self._injector.poll(task_id)\n'
    'File "runner/flight/faults.py", line 109, in poll\n    self._act(self._fault.action)\n'
    'File "runner/flight/faults.py", line 69, in perform\n    time.sleep(seconds)\n'
)
AGREE_STACK = (  # rank 0 of the same: waiting for rank 1 in the cancel agreement
    'File "runner/engine/task_run.py", line 56, in agree_to_stop\n'
    "    stop = self.collectives.any(poll and self.wants_stop())\n"
    'File "runner/engine/collectives.py", line 53, in any\n    return self.agree([int(flag)])[0] > 0\n'
    'File "runner/engine/collectives.py", line 61, in agree\n'
    "    return [int(v) for v in cast(list[int], total.tolist())]\n"
)


def teardown(log: LogBuilder) -> None:
    """After the master retired the instance: its runners are stopped (not evidence)."""
    log.advance(1)
    log.runner_status("i1", 0, "stopped", "SIGTERM", cause="terminated")
    log.runner_status("i1", 1, "stopped", "SIGTERM", cause="terminated")


def killed_then_peer_failed() -> LogBuilder:
    """SIGKILL of rank 1: the worker reports it, the master fails the task, rank 0 then loses its peer."""
    log = started(stop_after=3)
    log.runner_status("i1", 1, "failed", KILLED, cause="killed")
    master_decides(log)
    log.advance(0.2)
    log.runner_status("i1", 0, "failed", PEER_LOST, cause="peer_lost")
    return log


def peer_failed_before_kill_reported() -> LogBuilder:
    """The same, with rank 0's own error first: the kill report lands just after the task failed."""
    log = started(stop_after=3)
    log.failed("t1", f"rank 0 failed: {PEER_LOST}", rank=0)
    log.runner_status("i1", 0, "failed", PEER_LOST, cause="peer_lost")
    master_decides(log)  # a casualty alone: the master waits for the rank that died
    log.advance(0.5)
    log.runner_status("i1", 1, "failed", KILLED, cause="killed")
    master_decides(log)
    return log


def sleeping_rank_short_deadline() -> LogBuilder:
    """Rank 1 sleeps inside its cancel poll; the watchdog (12 s) fails the task before 20 s."""
    log = started(stop_after=3)
    beats(log, 12, {0: ("agree_cancel", 3, AGREE_STACK), 1: ("agree_cancel", 3, SLEEP_STACK)})
    watchdog_ticks(log, stall_s=12)
    teardown(log)
    return log


def frozen_rank_short_deadline() -> LogBuilder:
    """SIGSTOP of rank 1: its heartbeats stop, no exit is reported; the watchdog fails the task."""
    log = started(stop_after=3)
    beats(log, 12, {0: ("agree_cancel", 3, AGREE_STACK)})
    watchdog_ticks(log, stall_s=12)
    teardown(log)
    return log


def unplaceable_model() -> LogBuilder:
    log = LogBuilder()
    log.node_joined("n1")
    log.task_created("t1", model="/models/weightless")
    log.failed("t1", "model '/models/weightless' cannot be loaded: no *.safetensors weights")
    return log


def rank_error_then_shutdown() -> LogBuilder:
    """A node that left at shutdown, long after the task failed, did not fail it."""
    log = failed_with_error()
    log.advance(60)
    log.node_left("n2")
    return log


Scenario = Callable[[], LogBuilder]


def records(scenario: Scenario) -> list[ExportRecord]:
    return scenario().records


@dataclass(frozen=True)
class Case:
    """A hang shape and the one finding `shoal diagnose` makes of it."""

    scenario: Scenario
    kind: SubjectKind
    cause: Cause
    stuck: tuple[int, ...]


CATALOGUE: tuple[Case, ...] = (
    Case(runner_failed, "task", "rank_died", (1,)),
    Case(heartbeat_silence, "task", "rank_died", (1,)),
    Case(watchdog_failed_after_silence, "task", "rank_died", (1,)),
    Case(compute_stall, "task", "stalled_in_compute", (1,)),
    Case(collective_stall, "task", "stalled_in_collective", (0, 1)),
    Case(iteration_mismatch, "task", "iteration_mismatch", (1,)),
    Case(cancel_split, "task", "cancel_ignored", (1,)),
    Case(cancel_no_telemetry, "task", "cancel_ignored", (0, 1)),
    Case(node_timed_out, "task", "node_timed_out", (1,)),
    Case(node_timed_out_then_back, "task", "node_timed_out", (1,)),
    Case(no_instance, "task", "never_assigned", ()),
    Case(instance_loading, "task", "never_assigned", ()),
    Case(failed_with_error, "task", "rank_error", (0,)),
    Case(quiet_no_telemetry, "task", "no_evidence", (0, 1)),
    Case(idle_instance_rank_failed, "instance", "rank_died", (1,)),
    Case(node_gone_idle, "node", "node_timed_out", (1,)),
    Case(killed_then_peer_failed, "task", "rank_died", (1,)),
    Case(peer_failed_before_kill_reported, "task", "rank_died", (1,)),
    Case(sleeping_rank_short_deadline, "task", "stalled_in_compute", (1,)),
    Case(frozen_rank_short_deadline, "task", "rank_died", (1,)),
    Case(unplaceable_model, "task", "never_assigned", ()),
    Case(rank_error_then_shutdown, "task", "rank_error", (0,)),
)


# --- the master, run on the log as it stands ------------------------------------------------------

TICK_S = 0.5  # the master service's watchdog tick (MasterSettings.tick_seconds)


def log_events(log: LogBuilder) -> list[tuple[int, LogEvent]]:
    return [(r.seq, r.event) for r in log.records if isinstance(r.event, LogEvent)]


def folded(log: LogBuilder) -> State:
    """The State folded from the log's events stream, as the master (and diagnose) hold it."""
    return fold(log_events(log))


def liveness(log: LogBuilder, until_ns: int) -> Liveness:
    """What the master heard by `until_ns`: every node alive (the logs carry no node heartbeats)
    and the newest heartbeat of each runner."""
    runners: dict[RunnerKey, RunnerHeartbeat] = {}
    for record in log.records:
        beat = record.event
        if isinstance(beat, RunnerHeartbeat) and beat.env.wall_time <= until_ns:
            runners[(beat.instance_id, beat.rank)] = beat
    nodes = {node: until_ns for node in folded(log).nodes}
    return Liveness(nodes=nodes, runners=runners)


def _master_stamper(log: LogBuilder) -> Stamper:
    ids = itertools.count(1)
    return Stamper(
        Origin(service="master"), wall_ns=lambda: log.now_ns, mono_ns=lambda: log.now_ns, new_id=lambda: f"m{next(ids)}"
    )


def master_decides(log: LogBuilder) -> None:
    """The master core's decisions on the log's last event, appended as the master would."""
    events = log_events(log)
    core = MasterCore(MasterPolicy(), LocalModelCatalog(), _master_stamper(log))
    for event in core.decide(fold(events), events[-1][1]):
        log.record(event)


def watchdog_ticks(log: LogBuilder, stall_s: float, ready_s: float = 900.0) -> None:
    """One watchdog tick after the log's end, with `stall_s` as the stall deadline and `ready_s`
    as the loading deadline."""
    log.advance(TICK_S)
    policy = MasterPolicy(task_stall_seconds=stall_s, instance_ready_timeout_seconds=ready_s)
    for event in tick(folded(log), log.now_ns, liveness(log, log.now_ns), policy, _master_stamper(log)):
        log.record(event)
