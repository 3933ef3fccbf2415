"""A rank asks again for its placement while NATS cannot answer (a long chaos run lost instances
to one 503 "JetStream system temporarily unavailable" as a rank started), within a bound."""

from __future__ import annotations

import threading

import pytest
from nats.js.errors import ServiceUnavailableError

from events.catalogue import AnyEvent
from runner.service.main import fetch_placement
from tests.events.builders import Events


class FlakyLog:
    """Answers with `failures` in turn, then the placement; counts the questions."""

    def __init__(self, failures: list[Exception], answer: tuple[int, AnyEvent] | None) -> None:
        self.failures = failures
        self.answer = answer
        self.asked = 0

    def fetch_entry(self, subject: str, timeout: float = 10.0) -> tuple[int, AnyEvent] | None:
        self.asked += 1
        assert subject.endswith("placed")
        if self.failures:
            raise self.failures.pop(0)
        return self.answer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FastStop(threading.Event):
    """A stop flag whose waits pass at once, moving the clock instead."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.now += timeout or 0.0
        return self.is_set()


def test_a_transient_outage_is_waited_out() -> None:
    placed = Events().placed("i1")
    log = FlakyLog([ServiceUnavailableError(), TimeoutError("the log bridge did not answer")], (7, placed))
    clock = Clock()
    assert fetch_placement(log, "i1", FastStop(clock), clock=clock) == (7, placed)
    assert log.asked == 3
    assert clock.now == 0.5 + 1.0  # backing off


def test_an_outage_past_the_patience_fails_the_rank() -> None:
    clock = Clock()
    log = FlakyLog([ServiceUnavailableError() for _ in range(100)], None)
    with pytest.raises(ServiceUnavailableError):
        fetch_placement(log, "i1", FastStop(clock), patience_s=20, clock=clock)
    assert clock.now <= 20
    assert 3 < log.asked < 100  # asked again, at most every 5 s


def test_a_stopped_rank_stops_asking() -> None:
    clock = Clock()
    stop = FastStop(clock)
    stop.set()
    log = FlakyLog([ServiceUnavailableError()], None)
    with pytest.raises(ServiceUnavailableError):
        fetch_placement(log, "i1", stop, clock=clock)
    assert log.asked == 1


def test_no_placement_on_the_log_is_no_outage() -> None:
    log = FlakyLog([], None)
    with pytest.raises(RuntimeError, match="no InstancePlaced"):
        fetch_placement(log, "i1", threading.Event())
    assert log.asked == 1
