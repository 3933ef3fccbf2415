"""Everything one task's prefill and decode share on one rank, passed around as one object."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from events.vocabulary import ComputePhase
from runner.engine.collectives import Collectives
from runner.engine.protocols import CancelSource, PhaseTracker, RunnerSink
from runner.engine.sends import PendingSends, ReceiveGate
from runner.engine.shard import ShardCache, ShardPlacement


@dataclass(slots=True)
class TaskRun:
    task_id: str
    model: nn.Module
    placement: ShardPlacement
    caches: ShardCache
    outbox: PendingSends
    receive_gate: ReceiveGate
    collectives: Collectives
    cancel: CancelSource
    sink: RunnerSink
    phases: PhaseTracker
    progress: list[tuple[int, int]] = field(default_factory=list)
    cancelled_at: str | None = None
    callback_errors: list[Exception] = field(default_factory=list)

    def report_progress(self, processed: int, total: int, iteration: int) -> None:
        self.progress.append((processed, total))
        self.notify(self.sink.prefill_progress, self.task_id, processed, total, iteration)

    def notify(self, method: Callable[..., None], *args: Any) -> None:
        """Call the sink; a failure is kept for later, never allowed to skip a collective."""
        try:
            method(*args)
        except Exception as err:
            self.callback_errors.append(err)

    def wants_stop(self) -> bool:
        """This rank's vote. A cancel source that fails votes to stop: the group still agrees."""
        try:
            return bool(self.cancel.is_cancelled(self.task_id))
        except Exception as err:
            self.callback_errors.append(err)
            return True

    def agree_to_stop(self, phase: ComputePhase, iteration: int, poll: bool = True) -> bool:
        """Poll the local cancel source, then agree with every rank (one scalar all-reduce)."""
        self.phases.enter("agree_cancel", self.task_id, iteration)
        stop = self.collectives.any(poll and self.wants_stop())
        if stop:
            self.cancelled_at = f"{phase}:{iteration}"
        return stop

    def forward(self, tokens: mx.array) -> mx.array:
        """Run this rank's part of the model on a [rows, n] token array (lazily); returns logits."""
        logits = self.model(tokens, cache=self.caches.slots)
        self.receive_gate.wait()  # the graph is built: now wait (without spinning) for the receive's bytes
        return logits
