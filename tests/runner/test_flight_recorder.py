from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from events.catalogue import Origin, RunnerHeartbeat
from events.stamp import Stamper
from runner.engine.protocols import PhaseTracker
from runner.flight.recorder import HeartbeatThread, main_thread_stack

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


def recorder(tracker: FakeTracker | PhaseTracker, clock: FakeClock | None = None, **kw: float) -> HeartbeatThread:
    stamper = Stamper(Origin(service="runner", rank=1), wall_ns=lambda: 7, mono_ns=lambda: 7, new_id=lambda: "id")
    return HeartbeatThread(
        tracker,
        stamper,
        lambda beat: None,
        instance_id="inst_a",
        rank=1,
        mono_ns=clock if clock is not None else time.monotonic_ns,
        **kw,
    )


def test_stack_appears_only_once_the_phase_is_older_than_the_threshold() -> None:
    tracker, clock = FakeTracker(), FakeClock()
    tracker.current = FakeSnapshot("prefill", "task_1", 4, since_ns=100 * SECOND)
    beats = recorder(tracker, clock, stall_stack_seconds=10.0)

    clock.now = 100 * SECOND + 9 * SECOND
    young = beats.beat()
    assert (young.phase, young.task_id, young.iteration, young.phase_age_ms) == ("prefill", "task_1", 4, 9000)
    assert young.stack is None

    clock.now = 100 * SECOND + 10 * SECOND
    stale = beats.beat()
    assert stale.phase_age_ms == 10_000
    assert stale.stack is not None
    assert "test_stack_appears_only_once_the_phase_is_older_than_the_threshold" in stale.stack


def test_a_new_phase_resets_the_age_and_drops_the_stack() -> None:
    tracker, clock = FakeTracker(), FakeClock()
    beats = recorder(tracker, clock, stall_stack_seconds=1.0)
    tracker.current = FakeSnapshot("decode", "t", 0, since_ns=0)
    clock.now = 5 * SECOND
    assert beats.beat().stack is not None
    tracker.current = FakeSnapshot("idle", None, 0, since_ns=5 * SECOND)
    beat = beats.beat()
    assert beat.stack is None and beat.task_id is None and beat.phase_age_ms == 0


def test_thread_beats_while_the_main_thread_is_blocked_and_stops_promptly() -> None:
    tracker = PhaseTracker()  # the engine's real tracker
    published: list[RunnerHeartbeat] = []
    stamper = Stamper(Origin(service="runner", rank=0))
    tracker.enter("prefill", "task_9", 2)
    blocked = threading.Event()
    with HeartbeatThread(
        tracker, stamper, published.append, instance_id="i", rank=0, interval_s=0.01, stall_stack_seconds=0.05
    ) as thread:
        blocked.wait(0.3)  # the main thread "stuck" in a wait, as in a collective
        exiting = time.monotonic()
    assert time.monotonic() - exiting < 0.5  # the stop event wakes the thread: no waiting out a beat
    assert not thread._thread.is_alive()  # pyright: ignore[reportPrivateUsage]
    assert len(published) >= 5
    assert all(b.phase == "prefill" and b.task_id == "task_9" and b.iteration == 2 for b in published)
    stale = [b for b in published if b.stack is not None]
    assert stale and "blocked.wait" in stale[-1].stack  # the stack shows where the main thread sits


def test_a_failing_publish_does_not_stop_the_recorder() -> None:
    calls: list[int] = []

    def flaky(beat: RunnerHeartbeat) -> None:
        calls.append(1)
        raise ConnectionError("nats down")

    stamper = Stamper(Origin(service="runner", rank=0))
    with HeartbeatThread(PhaseTracker(), stamper, flaky, instance_id="i", rank=0, interval_s=0.01) as thread:
        time.sleep(0.1)
    assert len(calls) >= 3 and thread.failures == len(calls) and thread.published == 0


def test_main_thread_stack_of_a_vanished_thread_is_none() -> None:
    assert main_thread_stack(-12345) is None
