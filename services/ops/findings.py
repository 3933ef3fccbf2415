"""The vocabulary of a diagnosis: causes, limits, and what one finding holds (frozen, JSON-ready)."""

from __future__ import annotations

from typing import Literal

import msgspec

from events.culprit import STALLED_TASK_BOUNDS, Bounds
from events.evidence import RankView

Cause = Literal[
    "rank_died",  # a rank's process is gone: runner failed/stopped, or its heartbeats stopped
    "stalled_in_compute",  # a live rank sits in one phase, its stack in model code
    "stalled_in_collective",  # live ranks sit in a collective (all_sum, send/recv) nobody completes
    "iteration_mismatch",  # a rank is >= 2 iterations ahead of another: sends/recvs diverged
    "cancel_ignored",  # a cancel was requested and some ranks never acted on it
    "node_timed_out",  # the master stopped hearing from a node hosting a rank
    "never_assigned",  # a task no instance took
    "instance_not_ready",  # an instance that never became ready
    "load_timed_out",  # an instance retired by the loading deadline: the ranks still loading are named
    "rank_error",  # a task failed with an error a rank reported
    "no_evidence",  # stuck, but the log holds nothing to tell why (no telemetry)
    "quarantined_event",  # an event the fold refused (forged origin, unknown id, contradiction): skipped
]
SubjectKind = Literal["task", "instance", "node", "event"]

CAUSES: tuple[Cause, ...] = (
    "rank_died",
    "stalled_in_compute",
    "stalled_in_collective",
    "iteration_mismatch",
    "cancel_ignored",
    "node_timed_out",
    "never_assigned",
    "instance_not_ready",
    "load_timed_out",
    "rank_error",
    "no_evidence",
    "quarantined_event",
)


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """When quiet becomes stuck. Defaults suit ~1 Hz heartbeats and chunks of well under a second."""

    stuck_after_s: float = 30.0  # a task with no event for this long is stuck
    heartbeat_timeout_s: float = 10.0  # a rank silent this long (others alive) is presumed dead
    stall_phase_s: float = 20.0  # a phase older than this is a stall
    cancel_grace_s: float = 10.0  # every rank must have stopped this long after a cancel
    assign_timeout_s: float = 30.0  # a task unassigned this long will not be
    load_timeout_s: float = 600.0  # an instance not ready this long after placement is stuck

    def bounds(self, *, stalled: bool) -> Bounds:
        """Once the master's watchdog declared a task stalled, the watchdog's own (shorter) bounds
        name the culprit, as they did when it gave the task up: its deadline,
        `task_stall_seconds`, may be far below the ones above."""
        own = Bounds(silence_s=self.heartbeat_timeout_s, phase_s=self.stall_phase_s)
        if not stalled:
            return own
        return Bounds(
            silence_s=min(own.silence_s, STALLED_TASK_BOUNDS.silence_s),
            phase_s=min(own.phase_s, STALLED_TASK_BOUNDS.phase_s),
        )


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    kind: SubjectKind
    subject: str  # the task, instance or node id; "seq N" for an event
    cause: Cause
    summary: str
    next_step: str
    status: str = ""
    task_id: str | None = None
    instance_id: str | None = None
    stuck_ranks: tuple[int, ...] = ()
    ranks: tuple[RankView, ...] = ()
    idle_s: float = 0.0  # how long before the reference the subject last showed activity
    evidence: tuple[str, ...] = ()
    run: int = 0  # the run of the cluster its subject began in (services/ops/runs.py)


class Diagnosis(msgspec.Struct, frozen=True, kw_only=True):
    """What `shoal diagnose --json` prints."""

    reference_wall_ns: int  # "now": the wall clock live, the newest event offline
    reference: Literal["wall_clock", "end_of_log"]
    findings: tuple[Finding, ...]
    skipped: str | None = None  # the unusable tail of the input, if any
    run: int = 0  # the current run: the number of `ClusterStarted` in the log (0: none)
    run_started_wall_ns: int = 0
    history: bool = False  # findings of earlier runs are included
    earlier_findings: int = 0  # findings of earlier runs left out (history False)
