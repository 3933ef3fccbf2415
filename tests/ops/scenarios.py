"""Small logs, one per hang shape, built with `LogBuilder` (2 ranks unless said otherwise)."""

from __future__ import annotations

from collections.abc import Callable

from events.codec import ExportRecord
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
    log.runner_status("i1", 1, "failed", "exit code -9")
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


def no_instance() -> LogBuilder:
    log = LogBuilder()
    log.node_joined("n1")
    log.task_created("t1", model="big")
    log.advance(60)
    log.node_joined("n2")
    return log


def instance_loading() -> LogBuilder:
    log = LogBuilder()
    log.node_joined("n1")
    log.node_joined("n2")
    log.instance_placed("i1", NODES)
    log.runner_status("i1", 0, "ready")
    log.runner_status("i1", 1, "loading")
    log.task_created("t1")
    log.advance(60)
    log.node_joined("n3")
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
    log.stalled("t1", "no progress for 30s")
    log.failed("t1", "stalled: no progress for 30s")
    return log


def idle_instance_rank_failed() -> LogBuilder:
    log = LogBuilder()
    log.ready_instance("i1", NODES)
    log.advance(5)
    log.runner_status("i1", 1, "failed", "segfault")
    return log


def node_gone_idle() -> LogBuilder:
    log = LogBuilder()
    log.ready_instance("i1", NODES)
    log.advance(30)
    log.node_timed_out("n2", log.now_ns - 25 * 10**9)
    return log


# --- shapes seen in real clusters (tests/e2e/test_hang_catalogue.py): what happens after the end ---

KILLED = "runner process killed by SIGKILL; stderr tail:\n"
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
    'File "runner/engine/collectives.py", line 30, in any\n    return self.agree([int(flag)])[0] > 0\n'
    'File "runner/engine/collectives.py", line 25, in agree\n    mx.eval(summed)\n'
)


def teardown(log: LogBuilder) -> None:
    """After a task failed: the instance is retired and its runners stopped (not evidence)."""
    log.advance(0.1)
    log.retired("i1", "retired")
    log.advance(1)
    log.runner_status("i1", 0, "stopped", "SIGTERM")
    log.runner_status("i1", 1, "stopped", "SIGTERM")


def killed_then_peer_failed() -> LogBuilder:
    """SIGKILL of rank 1: the worker reports it, the master fails the task, rank 0 then loses its peer."""
    log = started(stop_after=3)
    log.runner_status("i1", 1, "failed", KILLED)
    log.failed("t1", f"instance i1 was retired: rank 1 failed: {KILLED}", rank=1)
    log.advance(0.2)
    log.runner_status("i1", 0, "failed", PEER_LOST)
    return log


def peer_failed_before_kill_reported() -> LogBuilder:
    """The same, with rank 0's own error first: the kill report lands just after the task failed."""
    log = started(stop_after=3)
    log.failed("t1", f"rank 0 failed: {PEER_LOST}", rank=0)
    log.runner_status("i1", 0, "failed", PEER_LOST)
    log.advance(0.5)
    log.runner_status("i1", 1, "failed", KILLED)
    return log


def sleeping_rank_short_deadline() -> LogBuilder:
    """Rank 1 sleeps inside its cancel poll; the watchdog (12 s) fails the task before 20 s."""
    log = started(stop_after=3)
    beats(log, 12, {0: ("agree_cancel", 3, AGREE_STACK), 1: ("agree_cancel", 3, SLEEP_STACK)})
    log.stalled("t1", "no progress for 12s")
    log.failed("t1", "stalled: no progress for 12s", rank=0)
    teardown(log)
    return log


def frozen_rank_short_deadline() -> LogBuilder:
    """SIGSTOP of rank 1: its heartbeats stop, no exit is reported; the watchdog fails the task."""
    log = started(stop_after=3)
    beats(log, 12, {0: ("agree_cancel", 3, AGREE_STACK)})
    log.stalled("t1", "no progress for 12s")
    log.failed("t1", "stalled: no progress for 12s", rank=0)
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
