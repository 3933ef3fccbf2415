"""Which run of the cluster a finding belongs to, so a live diagnosis shows now, not history.

The log outlives `shoal up`: each start appends a `ClusterStarted`, and a run is the stretch of
log from one to the next. Run 0 is what came before the first (a log older than this marker, or
a cluster started piece by piece). A finding belongs to the run its subject began in: a task's
creation, an instance's placement, an event's own seq, a node's last change of status. The
current run is the last; `shoal diagnose` shows its findings, and earlier runs' with `--history`.

Pure: the starts are collected by `scan` (`ScanResult.runs`), the findings by `diagnose`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import msgspec

from events.ids import InstanceId, NodeId, TaskId
from events.state import State
from services.ops.findings import Finding


class RunStart(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    wall_ns: int


class Runs:
    """The runs of a log, from their starts in log order."""

    def __init__(self, starts: Sequence[RunStart]) -> None:
        self.starts = tuple(starts)
        self._seqs = [start.seq for start in self.starts]
        self._walls = [start.wall_ns for start in self.starts]

    @property
    def current(self) -> int:
        return len(self.starts)

    def of_seq(self, seq: int) -> int:
        return bisect.bisect_right(self._seqs, seq)

    def of_wall(self, wall_ns: int) -> int:
        return bisect.bisect_right(self._walls, wall_ns)

    def of_finding(self, finding: Finding, state: State) -> int:
        """The run the finding's subject began in (the current one when the State cannot say)."""
        match finding.kind:
            case "task":
                task = state.tasks.get(TaskId(finding.subject))
                return self.of_seq(task.created_seq) if task is not None else self.current
            case "instance":
                instance = state.instances.get(InstanceId(finding.subject))
                return self.of_seq(instance.placed_seq) if instance is not None else self.current
            case "node":
                node = state.nodes.get(NodeId(finding.subject))
                return self.of_wall(node.changed_at) if node is not None else self.current
            case "event":
                return self.of_seq(int(finding.subject.removeprefix("seq ")))


def label_runs(findings: Sequence[Finding], state: State, runs: Runs) -> list[Finding]:
    """`findings`, each carrying the run it belongs to."""
    return [msgspec.structs.replace(f, run=runs.of_finding(f, state)) for f in findings]
