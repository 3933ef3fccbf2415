"""A host's wall clock, jumped by the chaos nemesis (`bench/chaos_faults.py`).

Python imports `sitecustomize` at start-up from the path; the chaos cluster puts this folder on
PYTHONPATH for every service on a host (and so for the runners they start), with
SHOAL_CHAOS_CLOCK_FILE naming that host's offset file. `time.time` and `time.time_ns` then read
the real clock plus the file's offset in seconds (re-read at most every 0.2 s of monotonic time),
before any shoal module binds them. The monotonic clock is left alone, as on a host whose wall
clock is stepped.

Why not libfaketime: Debian's 0.9.10 breaks Python's `time.sleep` (EINVAL from
`clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`) when the monotonic clock is left real, and
faking the monotonic clock too is not what a stepped wall clock does; the NATS servers (Go) read
the clock without libc, so no preload reaches them. A network namespace has no clock of its own:
time namespaces offset CLOCK_MONOTONIC and CLOCK_BOOTTIME only, never CLOCK_REALTIME.
"""

import os
import time


def _install(path: str) -> None:
    real_time_ns, monotonic = time.time_ns, time.monotonic
    cached = {"offset_ns": 0, "read_at": -1.0}

    def offset_ns() -> int:
        now = monotonic()
        if now - cached["read_at"] >= 0.2:
            cached["read_at"] = now
            try:
                with open(path) as file:
                    cached["offset_ns"] = int(float(file.read().strip() or 0) * 1e9)
            except (OSError, ValueError):
                cached["offset_ns"] = 0  # no file or a half-written one: the real clock
        return int(cached["offset_ns"])

    def time_ns() -> int:
        return real_time_ns() + offset_ns()

    def time_s() -> float:
        return time_ns() / 1e9

    time.time_ns = time_ns
    time.time = time_s


_FILE = os.environ.get("SHOAL_CHAOS_CLOCK_FILE")
if _FILE:
    _install(_FILE)
