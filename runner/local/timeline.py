"""A local rank's timeline: every phase its main thread entered, stamped with the wall clock and
the process's CPU time (`"timeline": true` in a job). `shoal bench prefill` reads from it where
each rank's time went, chunk by chunk: computing (CPU) or waiting (wall time without CPU)."""

from __future__ import annotations

import time

from events.vocabulary import Phase
from runner.engine.protocols import PhaseTracker

# One entry: the phase, its task, its iteration, time.monotonic_ns(), time.process_time_ns().
TimelineEntry = tuple[str, str | None, int, int, int]


class TimedPhases(PhaseTracker):
    """A `PhaseTracker` that also keeps every entry, for the rank's result."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[TimelineEntry] = []

    def enter(self, phase: Phase, task_id: str | None = None, iteration: int = 0) -> None:
        super().enter(phase, task_id, iteration)
        self.entries.append((phase, task_id, iteration, time.monotonic_ns(), time.process_time_ns()))
