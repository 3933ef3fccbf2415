"""Where each cancel landed, its latency, and hangs, from the log alone (a rank that never goes idle counts)."""

from __future__ import annotations

from bench.cancel_outcomes import Outcome, cadence, outcomes, pending
from events.catalogue import LogEvent, RunnerStatusChanged, TaskCancelled, TaskCompleted, TaskFailed
from events.ids import InstanceId, TaskId
from tests.events.builders import Events, FakeClock

START_NS = 1_700_000_000_000_000_000
DEADLINE_MS = 1000.0


class Timeline:
    """Events stamped at chosen milliseconds."""

    def __init__(self) -> None:
        self.clock = FakeClock(START_NS)
        self.ev = Events(self.clock)
        self.events: list[LogEvent] = []

    def at(self, ms: float) -> Events:
        self.clock.now_ns = START_NS + int(ms * 1_000_000)
        return self.ev

    def add(self, ms: float, event: LogEvent) -> None:
        self.at(ms)
        self.events.append(event)

    def cancelled(self, ms: float, task: str) -> None:
        self.add(ms, TaskCancelled(env=self.at(ms).api.stamp(), task_id=TaskId(task), reason="api"))

    def idle(self, ms: float, task: str, rank: int) -> None:
        env = self.at(ms).rank("i1", rank).stamp()
        self.add(ms, RunnerStatusChanged(env=env, instance_id=InstanceId("i1"), rank=rank, status="ready", detail=task))

    def ended(self, ms: float, task: str, reason: str) -> None:
        env = self.at(ms).task_rank(task).stamp()
        if reason == "failed":
            self.add(ms, TaskFailed(env=env, task_id=TaskId(task), error="boom"))
        else:
            self.add(ms, TaskCompleted(env=env, task_id=TaskId(task), finish_reason=reason))  # pyright: ignore[reportArgumentType]

    def cancel_that_stops(self, task: str, processed: int, idle_ms: tuple[float, float], at: float = 0.0) -> None:
        self.add(at, self.at(at).progress(task, rank=1, processed=processed))
        self.cancelled(at + 10, task)
        self.ended(at + 15, task, "cancelled")
        for rank, ms in enumerate(idle_ms):
            self.idle(at + 10 + ms, task, rank)


def test_each_cancel_is_placed_where_it_landed_and_timed_to_the_last_rank_idle() -> None:
    log = Timeline()
    log.cancel_that_stops("in_prefill", processed=128, idle_ms=(20, 45))
    log.cancel_that_stops("in_decode", processed=512, idle_ms=(70, 30), at=100)  # 512 of 512: decode had begun
    log.add(200, log.at(200).progress("too_late", rank=1, processed=512))
    log.ended(210, "too_late", "length")
    log.cancelled(220, "too_late")
    log.idle(215, "too_late", 0)
    log.idle(216, "too_late", 1)
    found = outcomes(log.events, ["in_prefill", "in_decode", "too_late"], world=2, deadline_ms=DEADLINE_MS)
    assert found == [
        Outcome("in_prefill", "prefill", 45.0),
        Outcome("in_decode", "decode", 70.0),
        Outcome("too_late", "missed", None),
    ]


def test_a_rank_that_never_goes_idle_a_slow_one_and_a_failure_are_hangs() -> None:
    log = Timeline()
    log.cancel_that_stops("slow", processed=128, idle_ms=(20, DEADLINE_MS + 1))
    log.cancelled(10, "one_rank_silent")
    log.idle(30, "one_rank_silent", 0)
    log.cancelled(10, "failed")
    log.ended(20, "failed", "failed")
    log.idle(30, "failed", 0)
    log.idle(31, "failed", 1)
    tasks = ["slow", "one_rank_silent", "failed", "never_seen"]
    found = outcomes(log.events, tasks, world=2, deadline_ms=DEADLINE_MS)
    assert [(o.task_id, o.landed, o.latency_ms) for o in found] == [(t, "hang", None) for t in tasks]
    assert pending(log.events, tasks, world=2) == ["one_rank_silent"]  # the bench waits for it, up to the deadline


def test_cadence_is_the_gap_between_one_ranks_chunks_and_between_tokens() -> None:
    log = Timeline()
    for ms, processed in ((0, 0), (5, 128), (65, 256), (125, 384), (130, 512)):  # 0: start, 512: decode's report
        log.add(ms, log.at(ms).progress("t1", rank=1, processed=processed))
    log.add(70, log.at(70).progress("t1", rank=0, processed=256))
    log.add(140, log.at(140).chunk("t1", 0, tokens=1))
    log.add(150, log.at(150).chunk("t1", 1, tokens=2))
    log.add(170, log.at(170).chunk("t1", 3, tokens=4))
    steps = cadence(log.events, rank=1)
    assert steps.prefill_chunk_ms == [60.0, 60.0]
    assert steps.decode_token_ms == [5.0, 5.0]


def test_a_batched_cancel_lands_when_its_batch_lets_it_go_on_every_rank() -> None:
    """A batching runner serves the other streams on: no rank goes idle for the task; its streams
    leave at the step that agreed the cancel, which the sampling rank's cancelled end marks."""
    log = Timeline()
    log.add(0, log.at(0).progress("batched", rank=1, processed=128))
    log.cancelled(10, "batched")
    log.ended(27, "batched", "cancelled")
    log.add(0, log.at(0).progress("still_running", rank=1, processed=512))
    log.cancelled(10, "still_running")
    log.cancelled(10, "ended_too_late")
    log.ended(10 + DEADLINE_MS + 1, "ended_too_late", "cancelled")
    tasks = ["batched", "still_running", "ended_too_late"]
    found = outcomes(log.events, tasks, world=2, deadline_ms=DEADLINE_MS)
    assert found == [
        Outcome("batched", "prefill", 17.0),
        Outcome("still_running", "hang", None),
        Outcome("ended_too_late", "hang", None),
    ]
    assert pending(log.events, tasks, world=2) == ["still_running"]
