"""The service's flight-recorder destination: each reading becomes a `RunnerHeartbeat` on the log.

The heartbeats go to the telemetry stream (the bridge routes them), where the watchdog and
`shoal diagnose` read which phase and iteration each rank is in, which tasks it is running (its
batch) and, for a stale phase, its stack. Per-step facts of a batch stay here, off the ordered log.
"""

from __future__ import annotations

from collections.abc import Callable

from events.catalogue import RunnerHeartbeat
from events.ids import InstanceId, TaskId
from events.stamp import Stamper
from runner.flight.recorder import FlightReading


class RunningTasks:
    """The tasks a rank is running, written by the main thread at step boundaries and read by the
    flight recorder's: one attribute holding an immutable tuple, so a reader sees the old batch or
    the new one, never a mix."""

    def __init__(self) -> None:
        self.tasks: tuple[TaskId, ...] = ()
        self.kv: tuple[int, int] | None = None  # the batch's KV positions (reserved, capacity), when it batches


class LogHeartbeats:
    def __init__(
        self,
        stamper: Stamper,
        publish: Callable[[RunnerHeartbeat], None],
        *,
        instance_id: str,
        rank: int,
        running: RunningTasks | None = None,
    ) -> None:
        self._stamper = stamper
        self._publish = publish
        self._instance_id = InstanceId(instance_id)
        self._rank = rank
        self._running = running or RunningTasks()

    def heartbeat(self, reading: FlightReading) -> RunnerHeartbeat:
        snap = reading.snapshot
        return RunnerHeartbeat(
            env=self._stamper.stamp(),
            instance_id=self._instance_id,
            rank=self._rank,
            phase=snap.phase,
            task_id=TaskId(snap.task_id) if snap.task_id is not None else None,
            iteration=snap.iteration,
            phase_age_ms=reading.age_ns // 1_000_000,
            stack=reading.stack,
            batch=list(self._running.tasks),
            kv_reserved_tokens=kv[0] if (kv := self._running.kv) is not None else None,
            kv_capacity_tokens=kv[1] if kv is not None else None,
        )

    def record(self, reading: FlightReading) -> None:
        self._publish(self.heartbeat(reading))
