"""The flight recorder: a heartbeat thread that says where the main thread is (DESIGN.md §3).

Every `interval_s` it reads the phase tracker the engine updates (`PhaseTracker.enter`) and
publishes a `RunnerHeartbeat`. It keeps beating while the main thread is blocked inside MLX (a
collective, a long matmul): MLX releases the GIL there, so this thread runs. Once the phase is
older than `stall_stack_seconds` the heartbeat carries the main thread's Python stack, so a hang
leaves its location in the log instead of only in a process nobody can attach to.

Cost: one snapshot under a lock and one publish per interval; the stack is formatted only for a
stale phase. No mlx import here: the stream name is read from an mlx already loaded by the engine.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from loguru import logger

from events.catalogue import RunnerHeartbeat
from events.ids import InstanceId, TaskId
from events.stamp import Stamper
from events.vocabulary import Phase

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


class HeartbeatThread:
    """Publishes heartbeats from a daemon thread between `__enter__` and `__exit__`.

    Construct it on the main thread: that is the thread whose stack (and MLX stream) it reports.
    """

    def __init__(
        self,
        tracker: PhaseSource,
        stamper: Stamper,
        publish: Callable[[RunnerHeartbeat], None],
        *,
        instance_id: str,
        rank: int,
        interval_s: float = 1.0,
        stall_stack_seconds: float = 10.0,
        mono_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._tracker = tracker
        self._stamper = stamper
        self._publish = publish
        self._instance_id = InstanceId(instance_id)
        self._rank = rank
        self._interval_s = interval_s
        self._stall_ns = int(stall_stack_seconds * 1e9)
        self._mono_ns = mono_ns
        self._main_id = threading.get_ident()
        self._stream = loaded_mlx_stream_name()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-rank{rank}", daemon=True)
        self.published = 0
        self.failures = 0

    def beat(self) -> RunnerHeartbeat:
        """Build one heartbeat from the tracker's current snapshot (no publishing)."""
        snap = self._tracker.snapshot()
        age_ns = max(0, self._mono_ns() - snap.since_ns)
        stack: str | None = None
        if age_ns >= self._stall_ns:
            stack = main_thread_stack(self._main_id)
            if stack is not None and self._stream is not None:
                stack = f"mlx stream: {self._stream}\n{stack}"
        return RunnerHeartbeat(
            env=self._stamper.stamp(),
            instance_id=self._instance_id,
            rank=self._rank,
            phase=snap.phase,
            task_id=TaskId(snap.task_id) if snap.task_id is not None else None,
            iteration=snap.iteration,
            phase_age_ms=age_ns // 1_000_000,
            stack=stack,
        )

    def _run(self) -> None:
        while True:
            try:
                self._publish(self.beat())
                self.published += 1
            except Exception as exc:  # a lost heartbeat must not end the recorder: keep beating
                self.failures += 1
                logger.warning("heartbeat of rank {} not published: {}", self._rank, exc)
            if self._stop.wait(self._interval_s):
                return

    def __enter__(self) -> HeartbeatThread:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=max(1.0, 2 * self._interval_s))
