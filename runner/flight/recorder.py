"""The flight recorder: one thread per rank process that says where the main thread is (docs/ARCHITECTURE.md §7).

Both shells run it; only the destination differs. The service's rank publishes each reading as a
`RunnerHeartbeat` to the log's telemetry stream (`runner.service.heartbeats.LogHeartbeats`); a
local rank rewrites `rank<r>.phase`, from which the launcher names the rank that stalled and its
phase (`runner.local.rank_main.PhaseFile`).

Every `interval_s` it reads the phase tracker the engine updates (`PhaseTracker.enter`) and
hands the reading to its destination. It keeps going while the main thread is blocked inside
MLX (a collective, a long matmul): MLX releases the GIL there, so this thread runs. Once the
phase is older than `stall_stack_seconds` the reading carries the main thread's Python stack,
so a hang leaves its location behind instead of only in a process nobody can attach to.

Cost: one snapshot read and one hand-off per interval; the stack is formatted only for a stale
phase. No mlx import here: the stream name is read from an mlx already loaded by the engine.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from loguru import logger

from events.runner_settings import RunnerSettings
from events.vocabulary import Phase

RUNNER_DEFAULTS = RunnerSettings()
LATE_WAKE_SECONDS = 3.0  # a wake-up this late is logged: the rank was silent for it, not stuck in its phase
MAX_STACK_FRAMES = 40  # the innermost frames: where it sits matters, not how it got there


class PhaseView(Protocol):
    """What `runner.engine.protocols.PhaseSnapshot` offers (kept structural so either side can evolve)."""

    @property
    def phase(self) -> Phase: ...
    @property
    def task_id(self) -> str | None: ...
    @property
    def iteration(self) -> int: ...
    @property
    def since_ns(self) -> int: ...  # time.monotonic_ns() when the phase was entered


class PhaseSource(Protocol):
    def snapshot(self) -> PhaseView: ...


@dataclass(frozen=True, slots=True)
class FlightReading:
    """What the recorder saw at one beat."""

    snapshot: PhaseView
    age_ns: int  # how long the main thread has been in this phase
    stack: str | None  # the main thread's stack, only once the phase is older than the stall threshold


class FlightDestination(Protocol):
    def record(self, reading: FlightReading) -> None:
        """Called on the recorder's thread. If it raises, the error is logged and the next beat comes anyway."""
        ...


def main_thread_stack(thread_id: int, limit: int = MAX_STACK_FRAMES) -> str | None:
    """The formatted Python stack of thread `thread_id`, innermost frames last; None if it is gone."""
    frame = sys._current_frames().get(thread_id)  # pyright: ignore[reportPrivateUsage]
    if frame is None:
        return None
    return "".join(traceback.format_stack(frame, limit=limit))


def loaded_mlx_stream_name() -> str | None:
    """The default MLX stream of the calling thread, if mlx is already imported (never imports it)."""
    core = sys.modules.get("mlx.core")
    if core is None:
        return None
    try:
        return str(core.default_stream(core.default_device()))
    except (AttributeError, RuntimeError, TypeError):  # an mlx without these, or no device yet
        return None


class FlightRecorder:
    """Hands a `FlightReading` to `destination` every `interval_s`, between `__enter__` and `__exit__`.

    Construct it on the main thread: that is the thread whose stack (and MLX stream) it reports.
    `stall_stack_seconds=None` never takes a stack (a destination that has no use for one).
    """

    def __init__(
        self,
        tracker: PhaseSource,
        destination: FlightDestination,
        *,
        rank: int,
        interval_s: float = RUNNER_DEFAULTS.heartbeat_interval_seconds,
        stall_stack_seconds: float | None = RUNNER_DEFAULTS.stall_stack_seconds,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._tracker = tracker
        self._destination = destination
        self._rank = rank
        self._interval_s = interval_s
        self._stall_ns = None if stall_stack_seconds is None else int(stall_stack_seconds * 1e9)
        self._mono_ns = mono_ns
        self._main_id = threading.get_ident()
        self._stream = loaded_mlx_stream_name()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"flight-recorder-rank{rank}", daemon=True)
        self.recorded = 0
        self.failures = 0

    def read(self) -> FlightReading:
        """One reading of the tracker's current snapshot (nothing is recorded)."""
        snap = self._tracker.snapshot()
        age_ns = max(0, self._mono_ns() - snap.since_ns)
        stack: str | None = None
        if self._stall_ns is not None and age_ns >= self._stall_ns:
            stack = main_thread_stack(self._main_id)
            if stack is not None and self._stream is not None:
                stack = f"mlx stream: {self._stream}\n{stack}"
        return FlightReading(snapshot=snap, age_ns=age_ns, stack=stack)

    def _run(self) -> None:
        while True:
            try:
                self._destination.record(self.read())
                self.recorded += 1
            except Exception as exc:  # a lost beat must not end the recorder: keep beating
                self.failures += 1
                logger.warning("flight recorder of rank {}: beat not recorded: {}", self._rank, exc)
            asleep_since = time.monotonic()  # real time: how long the process itself went without running
            if self._stop.wait(self._interval_s):
                return
            late = time.monotonic() - asleep_since - self._interval_s
            if late > max(LATE_WAKE_SECONDS, 3 * self._interval_s):  # no beat meanwhile: say why it was silent
                logger.warning(
                    "flight recorder of rank {}: woke {:.1f}s late (the process did not run, or a thread held the GIL)",
                    self._rank,
                    late,
                )

    def __enter__(self) -> FlightRecorder:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=max(1.0, 2 * self._interval_s))
