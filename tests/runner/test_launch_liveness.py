"""The local launcher tells a rank that is busy holding the GIL (its heartbeat silent, its CPU time
growing) from a frozen one (silent, no CPU): only the frozen one fails the run early. A rank
importing transformers on a loaded host had its heartbeat silent for 10 s and was called frozen."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.local.launch import Liveness, Unchanged, is_frozen, process_cpu_ticks
from tests.freeze import freeze

# A rank's flight recorder writing its phase file while the main thread sits in one C call that
# never lets go of the GIL (a builtin sum over a range checks for no thread switch).
GIL_HOG = """
import sys, time
from pathlib import Path
from runner.engine.protocols import PhaseTracker
from runner.flight.recorder import FlightRecorder
from runner.local.rank_main import PhaseFile

path = Path(sys.argv[1])
with FlightRecorder(PhaseTracker(), PhaseFile(path), rank=0, interval_s=0.01, stall_stack_seconds=None):
    while not path.exists():
        time.sleep(0.001)
    sum(range(10**11))
"""


@pytest.mark.parametrize(
    ("heartbeat_age", "cpu_idle", "frozen"),
    [
        (None, None, False),  # no heartbeat yet: the deadline judges a rank that never starts
        (None, 30.0, False),
        (5.0, 30.0, False),  # a fresh heartbeat
        (10.0, 30.0, False),  # the bound itself is not past it
        (11.0, 0.1, False),  # silent but using CPU: holding the GIL, working
        (11.0, 10.0, False),
        (11.0, 10.5, True),  # silent and idle past the bound: stopped, wedged, swapped out
        (11.0, None, True),  # no CPU time to read (macOS): the heartbeat decides alone
    ],
)
def test_frozen_means_silent_and_idle(heartbeat_age: float | None, cpu_idle: float | None, frozen: bool) -> None:
    assert is_frozen(heartbeat_age, cpu_idle, bound=10.0) is frozen
    assert not is_frozen(heartbeat_age, cpu_idle, bound=10.0, phase="loading")  # forming the ring: the deadline's


def test_a_rank_silent_in_any_later_phase_is_frozen() -> None:
    assert is_frozen(30.0, 30.0, bound=10.0, phase="prefill")
    assert is_frozen(30.0, None, bound=10.0, phase="decode")


def test_cpu_time_counts_from_the_last_poll_that_saw_it_grow(tmp_path: Path) -> None:
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        freeze(stopped.pid)  # its CPU time can no longer change
        idle, working = Liveness(stopped.pid, tmp_path / "a"), Liveness(busy.pid, tmp_path / "b")
        assert idle.idle_for(100.0) == 0.0 and working.idle_for(100.0) == 0.0  # the first poll starts the count
        seen = process_cpu_ticks(busy.pid)
        deadline = time.monotonic() + 30
        while process_cpu_ticks(busy.pid) == seen:
            assert time.monotonic() < deadline, "a busy loop used no CPU in 30 s"
            time.sleep(0.01)
        assert idle.idle_for(112.5) == 12.5
        assert working.idle_for(112.5) == 0.0
        idle.overlook(113.0)  # the launcher was not looking until 113: only what follows counts
        assert idle.idle_for(114.0) == 1.0
    finally:
        for child in (stopped, busy):
            child.kill()
            child.wait()
    assert process_cpu_ticks(busy.pid) is None  # gone: nothing to read


def test_a_heartbeat_is_silent_from_the_poll_that_first_saw_its_last_beat(tmp_path: Path) -> None:
    phase = tmp_path / "rank0.phase"
    liveness = Liveness(12345, phase)
    assert liveness.silent_for(10.0) is None  # no beat yet: the deadline's
    phase.write_text("{}")
    assert liveness.silent_for(11.0) == 0.0
    assert liveness.silent_for(20.0) == 9.0
    os.utime(phase, ns=(0, phase.stat().st_mtime_ns + 1))  # a beat, whatever the wall clock says
    assert liveness.silent_for(25.0) == 0.0
    assert liveness.silent_for(40.0) == 15.0


def test_a_reading_unchanged_counts_only_what_the_polls_saw() -> None:
    reading = Unchanged()
    assert reading.seen(1, 5.0) == 0.0
    assert reading.seen(1, 7.5) == 2.5
    reading.restart(30.0)
    assert reading.seen(1, 31.0) == 1.0
    assert reading.seen(2, 32.0) == 0.0


@pytest.mark.timeout(60)
def test_a_rank_holding_the_gil_goes_silent_but_is_not_frozen_until_stopped(tmp_path: Path) -> None:
    phase = tmp_path / "rank0.phase"
    hog = subprocess.Popen([sys.executable, "-c", GIL_HOG, str(phase)])
    try:
        liveness = Liveness(hog.pid, phase)
        deadline = time.monotonic() + 45
        # the beats stop once the sum holds the GIL
        while (silent := liveness.silent_for(time.monotonic())) is None or silent < 1.0:
            assert hog.poll() is None and time.monotonic() < deadline, "the heartbeat never went silent"
            liveness.idle_for(time.monotonic())
            time.sleep(0.02)
        idle = liveness.idle_for(time.monotonic())
        assert idle is not None and not is_frozen(silent, idle, bound=silent / 2), (silent, idle)
        freeze(hog.pid)
        now = time.monotonic()
        liveness.idle_for(now)
        later = now + 2 * silent  # as if the launcher polled the stopped process that much later
        assert is_frozen(liveness.silent_for(later), liveness.idle_for(later), bound=silent)
    finally:
        hog.kill()
        hog.wait()
