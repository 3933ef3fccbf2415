"""What the master heard, and when, by its own clock: the evidence of the watchdog's liveness rules.

Liveness is judged from the master's receive time, never from a sender's clock. A heartbeat's
`env.wall_time` is the sender's: compared with the master's clock it turns clock skew into
silence (a host whose clock runs a minute slow would be timed out while it beats every second,
one that runs fast would never be). So the shell records when each heartbeat *arrived*:
- a node is heard when its heartbeat arrives, and when the master first sees it up in the State
  (a join, a re-announce, or the master's own start): the node's `changed_at` only tells one
  announcement from the next, it is never compared with a clock;
- a runner's newest heartbeat is kept with its `env.wall_time` replaced by the arrival time, so
  `events.culprit` judges a rank silent by what the master heard, whatever the rank's clock says.

One `Hearing` belongs to one `Master` shell; the rules that read it (`watchdog.tick`) stay pure.
"""

from __future__ import annotations

import msgspec

from events.catalogue import NodeHeartbeat, RunnerHeartbeat, TelemetryEvent
from events.ids import NodeId
from events.state import State
from services.master.watchdog import Liveness, RunnerKey


def as_heard(beat: RunnerHeartbeat, received_ns: int) -> RunnerHeartbeat:
    """`beat` as the master heard it: stamped with its arrival on the master's clock."""
    return msgspec.structs.replace(beat, env=msgspec.structs.replace(beat.env, wall_time=received_ns))


class Hearing:
    """Arrival times (master's clock, ns) of each node's newest sign of life, and each runner's
    newest heartbeat as heard."""

    def __init__(self) -> None:
        self._nodes: dict[NodeId, int] = {}
        self._runners: dict[RunnerKey, RunnerHeartbeat] = {}
        self._announcements: dict[NodeId, int] = {}  # the `changed_at` of the announcement noticed

    def heard(self, beat: TelemetryEvent, received_ns: int) -> None:
        match beat:
            case NodeHeartbeat():
                self._nodes[beat.node_id] = received_ns
            case RunnerHeartbeat():
                self._runners[(beat.instance_id, beat.rank)] = as_heard(beat, received_ns)

    def notice(self, state: State, now_ns: int) -> None:
        """Count a node as heard now the first time the master sees it up after an announcement:
        a node that joined before its first heartbeat arrived (or before this master started) gets
        a full timeout from now, and a node that rejoined is not timed out again on stale evidence."""
        for node in state.nodes.values():
            if node.status == "up" and self._announcements.get(node.node_id) != node.changed_at:
                self._announcements[node.node_id] = node.changed_at
                self._nodes[node.node_id] = now_ns

    def liveness(self) -> Liveness:
        """A view for one synchronous tick (not a copy: nothing is heard while the tick runs)."""
        return Liveness(nodes=self._nodes, runners=self._runners)
