"""What the master heard, and when, by its own clock: the evidence of the watchdog's liveness rules.

Liveness is judged from the master's receive time, never from a sender's clock. An event's or a
heartbeat's `env.wall_time` is its sender's: compared with the master's clock it turns clock
skew into silence (a host whose clock runs a minute slow would be timed out while it beats every
second, one that runs fast would never be). So the shell records when things *arrived*:
- a node is heard when its heartbeat arrives, and when the master first sees it up in the State
  (a join, a re-announce, or the master's own start); its silence counts only while the master
  could see (`services.master.sight`: the master's own probes, read back on the same path), so
  a master whose reading stalled never times out the nodes for it;
- a runner's newest heartbeat is kept with its `env.wall_time` replaced by the arrival time, so
  `events.culprit` judges a rank silent by what the master heard, whatever the rank's clock says;
- a busy instance's progress is when the master first saw its head task where it is now (its
  time without progress, like a node's silence, counts only while the master could see), and a
  failed instance's losses when it first saw its down ranks as they are now;
- a task's age (its request deadline, its assignment timeout) counts from when the master first
  saw it in the log, never from the API's `created_at`; a loading instance's from its newest sign
  of loading as first seen; a head task's prefill positions and a cancel request likewise.
The State's stamps in those (`changed_at`, `last_activity_at`, `head_since`, `placed_at`, a
download's `at`) and the ranks' heartbeat positions only tell one value from the next here
(tokens compared for equality); they are never compared with a clock.
Seen on the tick after they arrive, so a deadline may run up to one tick late, never early.
The clock is the master's monotonic one (`Master.mono_ns`): a jump of its own wall clock moves
no deadline either.

One `Hearing` belongs to one `Master` shell; the rules that read it (`watchdog.tick`) stay pure.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

import msgspec

from events.catalogue import MasterProbe, NodeHeartbeat, RunnerHeartbeat, TelemetryEvent
from events.ids import InstanceId, NodeId, TaskId
from events.retention import live_tasks_of
from events.state import State
from services.master.sight import Sight
from services.master.watchdog import Liveness, RankOfTask, RunnerKey, batch_activity, loading_signs


def as_heard(beat: RunnerHeartbeat, received_ns: int) -> RunnerHeartbeat:
    """`beat` as the master heard it: stamped with its arrival on the master's clock."""
    return msgspec.structs.replace(beat, env=msgspec.structs.replace(beat.env, wall_time=received_ns))


K = TypeVar("K", bound=Hashable)
Seen = dict[K, tuple[Hashable, int]]  # key -> (its value's token, when first seen with it)


def first_seen(before: Seen[K], tokens: Mapping[K, Hashable], now_ns: int) -> Seen[K]:
    """Each key of `tokens` with the time its current token was first seen: kept from `before`
    while the token is unchanged, `now_ns` when it is new. Keys no longer in `tokens` are dropped."""
    return {
        key: seen if (seen := before.get(key)) is not None and seen[0] == token else (token, now_ns)
        for key, token in tokens.items()
    }


def activity_tokens(state: State, runners: Mapping[RunnerKey, RunnerHeartbeat]) -> dict[InstanceId, Hashable]:
    """What changes whenever a busy instance makes progress: its head task, when it became the
    head, the newest event of each task of its running batch (`watchdog.batch_activity`), and
    where each rank's newest heartbeat says it is (phase, task, step). The master does not fold
    `ChunkGenerated` (per token: its CPU would come out of the forward on a small machine), so a
    decoding batch shows its progress by its ranks' steps, which advance once per token; a frozen
    rank stops them all (its peers wait in the next collective), while its recorder keeps beating
    the same step."""
    tokens: dict[InstanceId, Hashable] = {}
    for instance in state.instances.values():
        if not instance.retired and instance.queue:
            head = state.tasks[instance.queue[0]]
            steps = tuple(_position(runners.get((instance.instance_id, r.rank))) for r in instance.runners)
            tokens[instance.instance_id] = (head.task_id, instance.head_since, steps, *batch_activity(state, instance))
    return tokens


def _position(beat: RunnerHeartbeat | None) -> Hashable:
    return None if beat is None else (beat.phase, beat.task_id, beat.iteration)


def task_tokens(state: State) -> dict[TaskId, Hashable]:
    """Every live task, as itself: first seen once, when it appears."""
    return {task.task_id: True for task in live_tasks_of(state)}


def cancel_tokens(state: State) -> dict[TaskId, Hashable]:
    """Every live task whose cancel was requested, with its reason."""
    return {task.task_id: task.cancel_reason for task in live_tasks_of(state) if task.cancel_reason is not None}


def loading_tokens(state: State) -> dict[InstanceId, Hashable]:
    """Every loading instance with its signs of loading (`watchdog.loading_signs`)."""
    return {
        instance.instance_id: loading_signs(state, instance)
        for instance in state.instances.values()
        if not (instance.retired or instance.ready or instance.failed)
    }


def progress_tokens(state: State) -> dict[RankOfTask, Hashable]:
    """Each rank's prefill position of the head task of each busy instance."""
    tokens: dict[RankOfTask, Hashable] = {}
    for instance in state.instances.values():
        if not instance.retired and instance.queue:
            head = state.tasks[instance.queue[0]]
            for rank, position in head.progress.items():
                tokens[(head.task_id, rank)] = (position.iteration, position.processed, position.at)
    return tokens


def loss_tokens(state: State) -> dict[InstanceId, Hashable]:
    """The down ranks of each failed instance, with their last status change."""
    return {
        instance.instance_id: tuple((r.rank, r.changed_at) for r in instance.runners if r.down)
        for instance in state.instances.values()
        if not instance.retired and instance.failed
    }


class Hearing:
    """Arrival times (master's clock, ns) of each node's newest sign of life, each runner's newest
    heartbeat as heard, and when each instance's progress and losses were first seen; `sight`
    reads back the probes of the master named `master` (its lease holder name). Times are the
    master's monotonic ns; `wall_offset_ns` (set by `notice`) turns one into its wall ns."""

    def __init__(self, master: str, probe_interval_seconds: float) -> None:
        self.master = master
        self.sight = Sight(probe_interval_seconds)
        self._nodes: dict[NodeId, int] = {}
        self._runners: dict[RunnerKey, RunnerHeartbeat] = {}
        self._announcements: dict[NodeId, int] = {}  # the `changed_at` of each node up, as a token
        self._activity: Seen[InstanceId] = {}
        self._losses: Seen[InstanceId] = {}
        self._tasks: Seen[TaskId] = {}
        self._cancels: Seen[TaskId] = {}
        self._loading: Seen[InstanceId] = {}
        self._progress: Seen[RankOfTask] = {}
        self._wall_offset_ns = 0

    def heard(self, beat: TelemetryEvent, received_ns: int) -> None:
        match beat:
            case NodeHeartbeat():
                self._nodes[beat.node_id] = received_ns
            case RunnerHeartbeat():
                self._runners[(beat.instance_id, beat.rank)] = as_heard(beat, received_ns)
            case MasterProbe():
                if beat.master == self.master:  # another master's probes prove nothing about our reading
                    self.sight.probe_returned(beat.env.mono_ns, received_ns)  # sent and read on one clock

    def notice(self, state: State, now_ns: int, wall_ns: int | None = None) -> None:
        """Take in what the State shows at `now_ns`. A node seen up after a new announcement counts
        as heard now: one that joined before its first heartbeat arrived (or before this master
        started) gets a full timeout from now, and one that rejoined is not timed out again on
        stale evidence. `wall_ns`: the master's wall clock read with `now_ns` (None: the same clock)."""
        self._wall_offset_ns = 0 if wall_ns is None else wall_ns - now_ns
        ups = {node.node_id: node.changed_at for node in state.nodes.values() if node.status == "up"}
        for node_id, announced in ups.items():
            if self._announcements.get(node_id) != announced:
                self._nodes[node_id] = now_ns
        self._announcements = ups
        self._activity = first_seen(self._activity, activity_tokens(state, self._runners), now_ns)
        self._losses = first_seen(self._losses, loss_tokens(state), now_ns)
        self._tasks = first_seen(self._tasks, task_tokens(state), now_ns)
        self._cancels = first_seen(self._cancels, cancel_tokens(state), now_ns)
        self._loading = first_seen(self._loading, loading_tokens(state), now_ns)
        self._progress = first_seen(self._progress, progress_tokens(state), now_ns)

    def liveness(self) -> Liveness:
        """A view for one synchronous tick (nothing is heard while the tick runs)."""
        return Liveness(
            nodes=self._nodes,
            node_silence={node_id: self.sight.silence(heard) for node_id, heard in self._nodes.items()},
            runners=self._runners,
            activity_silence={key: self.sight.silence(at) for key, (_, at) in self._activity.items()},
            losses=_times(self._losses),
            tasks=_times(self._tasks),
            loading=_times(self._loading),
            progress=_times(self._progress),
            cancels=_times(self._cancels),
            wall_offset_ns=self._wall_offset_ns,
        )


def _times(seen: Seen[K]) -> dict[K, int]:
    return {key: seen_at for key, (_, seen_at) in seen.items()}
