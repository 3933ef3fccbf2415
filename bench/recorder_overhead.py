"""The flight recorder's cost to a decode-like loop, for `shoal bench replay`.

Two figures: the A/B loop (a Python loop doing some work and a phase update per "token",
with no recorder, and with one beating at 1 Hz, 10 Hz, and 10 Hz with a stack every beat,
interleaved in rounds), and the cost of building and encoding one heartbeat, which bounds the
recorder's share of the main thread's time (`cost x beats per second`) without depending on
what else the machine is doing.
"""

from __future__ import annotations

import time
import timeit
from typing import Any

from bench.rounds import run_rounds
from bench.stats import compare, summarize
from events.catalogue import Origin
from events.codec import encode
from events.stamp import Stamper
from runner.engine.protocols import PhaseTracker
from runner.flight.recorder import FlightRecorder
from runner.service.heartbeats import LogHeartbeats

CONFIGS: dict[str, tuple[float | None, float]] = {  # name -> (beat interval, stall_stack_seconds)
    "none": (None, 10.0),
    "1hz": (1.0, 10.0),
    "10hz": (0.1, 10.0),
    "10hz_stack_every_beat": (0.1, 0.0),
}
BEAT_SAMPLES = 15  # timeit repeats of the beat cost
BEATS_PER_SAMPLE = 2000


def _busy_tokens(seconds: float, tracker: PhaseTracker) -> float:
    """Tokens per CPU second of the whole process (the recorder thread's work is charged to
    the loop; other processes on a shared machine are not)."""
    tokens = 0
    cpu = time.process_time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        sum(range(400))
        tracker.enter("decode", "task_bench", tokens)
        tokens += 1
    return tokens / max(1e-9, time.process_time() - cpu)


def _with_recorder(seconds: float, interval_s: float | None, stall_s: float) -> float:
    tracker = PhaseTracker()
    if interval_s is None:
        return _busy_tokens(seconds, tracker)
    stamper = Stamper(Origin(service="runner", rank=0))

    def publish(beat: Any) -> None:
        encode(beat)  # what publishing costs this thread before the socket

    heartbeats = LogHeartbeats(stamper, publish, instance_id="inst_bench", rank=0)
    with FlightRecorder(tracker, heartbeats, rank=0, interval_s=interval_s, stall_stack_seconds=stall_s):
        return _busy_tokens(seconds, tracker)


def beat_costs_us(stall_s: float) -> list[float]:
    """Microseconds to build and encode one heartbeat, one sample per timeit repeat."""
    tracker = PhaseTracker()
    tracker.enter("prefill", "task_bench", 3)
    stamper = Stamper(Origin(service="runner", rank=0))
    heartbeats = LogHeartbeats(stamper, lambda beat: None, instance_id="i", rank=0)
    recorder = FlightRecorder(tracker, heartbeats, rank=0, stall_stack_seconds=stall_s)
    totals = timeit.repeat(
        lambda: encode(heartbeats.heartbeat(recorder.read())), repeat=BEAT_SAMPLES, number=BEATS_PER_SAMPLE
    )
    return [total / BEATS_PER_SAMPLE * 1e6 for total in totals]


def measure(seconds: float, rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(measures, comparisons) of the recorder's overhead."""
    sides = {
        name: (lambda i=interval, s=stall: _with_recorder(seconds, i, s)) for name, (interval, stall) in CONFIGS.items()
    }
    rates = run_rounds(sides, rounds)
    measures: dict[str, Any] = {
        f"loop_{name}_tokens_per_cpu_s": summarize(rates[name], "tok/cpu-s") for name in CONFIGS
    }
    plain, stacked = beat_costs_us(10.0), beat_costs_us(0.0)
    measures["beat_cost_us"] = summarize(plain, "us")
    measures["beat_with_stack_cost_us"] = summarize(stacked, "us")
    # The bound: one beat a second costs `cost` microseconds of each second's main-thread time.
    measures["bound_overhead_pct_1hz"] = summarize([us / 1e6 * 100 for us in plain], "%")
    measures["bound_overhead_pct_10hz_stack_every_beat"] = summarize([us * 10 / 1e6 * 100 for us in stacked], "%")
    comparisons = {
        f"loop_{name}_vs_none": compare(rates[name], rates["none"], "ratio", f"loop with the recorder at {name} / none")
        for name in CONFIGS
        if name != "none"
    }
    return measures, comparisons
