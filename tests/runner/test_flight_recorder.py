from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from events.catalogue import Envelope, Origin, RunnerHeartbeat
from events.ids import TaskId
from events.stamp import Stamper
from runner.engine.protocols import PhaseTracker
from runner.flight.recorder import FlightReading, FlightRecorder, main_thread_stack
from runner.local.rank_main import PhaseFile
from runner.service.heartbeats import LogHeartbeats, RunningTasks

SECOND = 1_000_000_000


@dataclass
class FakeSnapshot:
    phase: str
    task_id: str | None
    iteration: int
    since_ns: int


class FakeTracker:
    def __init__(self) -> None:
        self.current = FakeSnapshot("idle", None, 0, 0)

    def snapshot(self) -> FakeSnapshot:
        return self.current


class FakeClock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


class Readings:
    def __init__(self) -> None:
        self.seen: list[FlightReading] = []

    def record(self, reading: FlightReading) -> None:
        self.seen.append(reading)


def log_heartbeats(publish: list[RunnerHeartbeat] | None = None) -> LogHeartbeats:
    stamper = Stamper(Origin(service="runner", rank=1), wall_ns=lambda: 7, mono_ns=lambda: 7, new_id=lambda: "id")
    return LogHeartbeats(stamper, (publish if publish is not None else []).append, instance_id="inst_a", rank=1)


def test_stack_appears_only_once_the_phase_is_older_than_the_threshold() -> None:
    tracker, clock = FakeTracker(), FakeClock()
    tracker.current = FakeSnapshot("prefill", "task_1", 4, since_ns=100 * SECOND)
    recorder = FlightRecorder(tracker, Readings(), rank=1, mono_ns=clock, stall_stack_seconds=10.0)
    heartbeats = log_heartbeats()

    clock.now = 100 * SECOND + 9 * SECOND
    young = heartbeats.heartbeat(recorder.read())
    assert (young.phase, young.task_id, young.iteration, young.phase_age_ms) == ("prefill", "task_1", 4, 9000)
    assert young.instance_id == "inst_a" and young.rank == 1 and young.stack is None

    clock.now = 100 * SECOND + 10 * SECOND
    stale = heartbeats.heartbeat(recorder.read())
    assert stale.phase_age_ms == 10_000
    assert stale.stack is not None
    assert "test_stack_appears_only_once_the_phase_is_older_than_the_threshold" in stale.stack


def test_a_new_phase_resets_the_age_and_drops_the_stack() -> None:
    tracker, clock = FakeTracker(), FakeClock()
    recorder = FlightRecorder(tracker, Readings(), rank=1, mono_ns=clock, stall_stack_seconds=1.0)
    tracker.current = FakeSnapshot("decode", "t", 0, since_ns=0)
    clock.now = 5 * SECOND
    assert recorder.read().stack is not None
    tracker.current = FakeSnapshot("idle", None, 0, since_ns=5 * SECOND)
    beat = log_heartbeats().heartbeat(recorder.read())
    assert beat.stack is None and beat.task_id is None and beat.phase_age_ms == 0


def test_without_a_stall_threshold_no_stack_is_ever_taken() -> None:
    tracker, clock = FakeTracker(), FakeClock()
    recorder = FlightRecorder(tracker, Readings(), rank=0, mono_ns=clock, stall_stack_seconds=None)
    clock.now = 3600 * SECOND
    reading = recorder.read()
    assert reading.age_ns == 3600 * SECOND and reading.stack is None


def test_thread_beats_while_the_main_thread_is_blocked_and_stops_promptly() -> None:
    tracker = PhaseTracker()  # the engine's real tracker
    published: list[RunnerHeartbeat] = []
    tracker.enter("prefill", "task_9", 2)
    blocked = threading.Event()
    heartbeats = log_heartbeats(published)
    with FlightRecorder(tracker, heartbeats, rank=0, interval_s=0.01, stall_stack_seconds=0.05) as recorder:
        blocked.wait(0.3)  # the main thread "stuck" in a wait, as in a collective
        exiting = time.monotonic()
    assert time.monotonic() - exiting < 0.5  # the stop event wakes the thread: no waiting out a beat
    assert not recorder._thread.is_alive()  # pyright: ignore[reportPrivateUsage]
    assert len(published) >= 5 and recorder.recorded == len(published)
    assert all(b.phase == "prefill" and b.task_id == "task_9" and b.iteration == 2 for b in published)
    stacks = [b.stack for b in published if b.stack is not None]
    # The stacks show where the main thread sits: in the wait, once the phase is 0.05 s old. (Under
    # load the first can be older, taken while the main thread still started the recorder's thread,
    # and the last newer, taken while it joined it.)
    assert any("blocked.wait" in stack for stack in stacks), stacks


def test_a_failing_destination_does_not_stop_the_recorder() -> None:
    calls: list[int] = []

    class Flaky:
        def record(self, reading: FlightReading) -> None:
            calls.append(1)
            raise ConnectionError("nats down")

    with FlightRecorder(PhaseTracker(), Flaky(), rank=0, interval_s=0.01) as recorder:
        time.sleep(0.1)
    assert len(calls) >= 3 and recorder.failures == len(calls) and recorder.recorded == 0


def test_the_local_destination_writes_the_phase_the_launcher_reads(tmp_path: Path) -> None:
    tracker = PhaseTracker()
    tracker.enter("decode", "task_3", 7)
    path = tmp_path / "rank1.phase"
    with FlightRecorder(tracker, PhaseFile(path), rank=1, interval_s=0.01, stall_stack_seconds=None):
        time.sleep(0.05)
    snap = tracker.snapshot()
    written = json.loads(path.read_text())
    assert written == {"phase": "decode", "task_id": "task_3", "iteration": 7, "since_ns": snap.since_ns}
    assert not path.with_name(path.name + ".tmp").exists()  # written to a staging file, then renamed over


def test_main_thread_stack_of_a_vanished_thread_is_none() -> None:
    assert main_thread_stack(-12345) is None


def test_a_heartbeat_names_every_task_of_the_ranks_batch() -> None:
    """The running tasks (written by the task loop at step boundaries) ride on each beat, in
    telemetry, so the watchdog and diagnose see the whole batch behind a stalled rank."""
    tracker, clock = FakeTracker(), FakeClock()
    tracker.current = FakeSnapshot("decode", "t1", 12, since_ns=0)
    running = RunningTasks()
    stamper = Stamper(Origin(service="runner", rank=1), wall_ns=lambda: 7, mono_ns=lambda: 7, new_id=lambda: "id")
    heartbeats = LogHeartbeats(stamper, [].append, instance_id="inst_a", rank=1, running=running)
    recorder = FlightRecorder(tracker, Readings(), rank=1, mono_ns=clock)
    assert heartbeats.heartbeat(recorder.read()).tasks == ("t1",)  # no batch known: the phase's task
    running.tasks = (TaskId("t1"), TaskId("t2"))
    beat = heartbeats.heartbeat(recorder.read())
    assert beat.batch == ["t1", "t2"] and beat.tasks == ("t1", "t2") and beat.task_id == "t1"
    assert (beat.kv_reserved_tokens, beat.kv_capacity_tokens) == (None, None)  # not known yet
    running.kv = (1200, 4096)  # the batch's KV positions: reserved, held
    beat = heartbeats.heartbeat(recorder.read())
    assert (beat.kv_reserved_tokens, beat.kv_capacity_tokens) == (1200, 4096)


def test_a_heartbeat_from_before_batching_still_decodes() -> None:
    old = msgspec.msgpack.encode(
        {
            "type": "runner_heartbeat",
            "env": msgspec.to_builtins(_env()),
            "instance_id": "i1",
            "rank": 0,
            "phase": "idle",
        }
    )
    beat = msgspec.msgpack.decode(old, type=RunnerHeartbeat)
    assert beat.batch == [] and beat.tasks == ()


def _env() -> Envelope:
    return Stamper(Origin(service="runner", rank=0), new_id=lambda: "id").stamp()
