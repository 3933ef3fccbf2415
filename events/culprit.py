"""Who broke an instance's group: one judgment, made by the master's watchdog and `shoal diagnose`.

`name_culprit` reads the evidence from the most direct to the least and stops at the first rule
that names a rank:

    node gone > rank down (killed > exited > lost only peers) > silent > diverged >
    ignored a cancel > stalled (in compute, else in a collective) > cancel pending >
    reported the failure > least progress

The callers differ only in what they hold. The watchdog judges the head task of a live instance
from the newest heartbeat it heard of each rank, when it gives the task up; diagnose judges any
task from the log's heartbeats, at the task's end or now. Given the same evidence they name the
same ranks: tests/ops/test_culprit_agreement.py runs the hang catalogue through both. Pure.

What belongs to an ended task's story is judged by the log's order, never by comparing stamps:
a node's going away is stamped by the master or its worker, a rank's exit by its worker, the
task's end by the sampling rank or the master, each on its own host's wall clock, and minutes of
skew between them would move a death in or out of the story. `story_end_seq` says how far it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args, overload

import msgspec

from events.catalogue import RunnerHeartbeat
from events.evidence import RankView, rank_views, waits_in_collective
from events.state import InstanceInfo, NodeInfo, RunnerInfo, State, TaskInfo
from events.vocabulary import COMPUTE_PHASES, STOPPING_PHASES, WORKING_PHASES

DownCause = Literal[
    "killed",  # the rank's process was killed by a signal
    "exited",  # the rank went down on its own (an error, a crash, an exit status)
    "unreported",  # its peers lost it, yet no exit of its own was reported (worker or node gone?)
]
CulpritCause = Literal[
    "node_gone",  # the node hosting the rank timed out or left
    DownCause,
    "silent",  # its heartbeats stopped while its peers' went on (frozen, or gone unreported)
    "diverged",  # >= 2 prefill iterations behind a peer: the sends/recvs no longer pair up
    "ignored_cancel",  # still computing after its peers agreed to stop
    "stalled_in_compute",  # alive, but in one phase too long, its stack outside any collective
    "stalled_in_collective",  # alive, waiting in a collective nobody completes (every such rank)
    "cancel_pending",  # a cancel was requested; these ranks never acted on it
    "reported",  # the rank that reported the task's failure
    "least_progress",  # nothing stronger: the ranks furthest behind (all, when none progressed)
]

DOWN_CAUSES: frozenset[CulpritCause] = frozenset(get_args(DownCause))


class Bounds(msgspec.Struct, frozen=True, kw_only=True):
    silence_s: float  # a rank silent this long while a peer still beats has stopped
    phase_s: float  # a rank in one phase this long is stuck there


# Once a task is declared stalled (the watchdog's deadline passed) these name the culprit:
# about five missed 1 Hz heartbeats, a phase three seconds old.
STALLED_TASK_BOUNDS = Bounds(silence_s=5.0, phase_s=3.0)


class Culprit(msgspec.Struct, frozen=True, kw_only=True):
    ranks: tuple[int, ...]
    cause: CulpritCause
    # Ranks down only as a consequence (they lost their peer). With cause `unreported` these are
    # all the ranks that went down, and `ranks` the ones that never reported (or, when every rank
    # reported a lost peer, the same ranks: nobody else is left to blame).
    followers: tuple[int, ...] = ()

    @property
    def sole_rank(self) -> int | None:
        """The rank to blame alone (`TaskFailed.rank`); None when several share the blame."""
        return self.ranks[0] if len(self.ranks) == 1 else None

    def describe(self) -> str:
        """`rank 1 (stalled in compute)`, `ranks [0, 1] (stalled in collective)`."""
        who = f"rank {self.ranks[0]}" if len(self.ranks) == 1 else f"ranks {list(self.ranks)}"
        return f"{who} ({self.cause.replace('_', ' ')})"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the rules read: one instance, the task it ran (None: the instance alone), each
    rank's view at the reference time, and the bounds past which quiet means stuck.

    `beats` (to `about_instance` / `about_task`): the newest heartbeat the caller knows of each
    rank, by rank."""

    state: State
    instance: InstanceInfo
    task: TaskInfo | None
    views: tuple[RankView, ...]
    bounds: Bounds

    @classmethod
    def about_instance(
        cls,
        state: State,
        instance: InstanceInfo,
        beats: Mapping[int, RunnerHeartbeat],
        reference_ns: int,
        bounds: Bounds,
    ) -> Evidence:
        return cls(state, instance, None, rank_views(None, instance, beats, reference_ns), bounds)

    @property
    def heard(self) -> bool:
        """Some rank's heartbeat is known: silence means something."""
        return any(v.heartbeat_ago_s is not None for v in self.views)

    @property
    def broke_with_task(self) -> bool:
        """The ended task's instance broke with it: it was retired with a rank failed by then,
        and no other task was assigned to it after this one ended. Its ranks' later failures
        (a peer that lost the killed rank, reported as the instance stops) are this story's too."""
        task, instance = self.task, self.instance
        if task is None or not task.ended or not instance.retired or instance.last_assigned_seq > task.ended_seq:
            return False
        return any(r.status == "failed" and r.changed_seq <= instance.retired_seq for r in instance.runners)

    @property
    def story_end_seq(self) -> int | None:
        """The last seq of the log that belongs to the task's story; None: it has not ended, so
        everything until now does.

        An ended task's story runs on past its end only while its instance is breaking because
        of it (`broke_with_task`): a rank's own error can fail the task before its worker's
        report of the killed peer lands, or before the master times out the node whose loss the
        ranks already felt; then the story runs until the instance's retirement. Otherwise it
        ends with the task (an instance that went on serving, or idled until a node left at
        shutdown, failed later for reasons of its own)."""
        task = self.task
        if task is None or not task.ended:
            return None
        return max(task.ended_seq, self.instance.retired_seq) if self.broke_with_task else task.ended_seq


@dataclass(frozen=True, slots=True)
class TaskEvidence(Evidence):
    task: TaskInfo

    @classmethod
    def about_task(
        cls,
        state: State,
        instance: InstanceInfo,
        task: TaskInfo,
        beats: Mapping[int, RunnerHeartbeat],
        reference_ns: int,
        bounds: Bounds,
        silences: Mapping[int, float] | None = None,
    ) -> TaskEvidence:
        """`silences`: see `events.evidence.rank_views`."""
        return cls(state, instance, task, rank_views(task, instance, beats, reference_ns, silences), bounds)


InstanceRule = Callable[[Evidence], Culprit | None]
TaskRule = Callable[[TaskEvidence], Culprit | None]


@overload
def name_culprit(evidence: TaskEvidence) -> Culprit: ...
@overload
def name_culprit(evidence: Evidence) -> Culprit | None: ...
def name_culprit(evidence: Evidence) -> Culprit | None:
    """The rank(s) that broke the instance (while it ran the task).

    About an instance alone only the node, down and silence rules apply, and None means nothing
    is wrong; about a task a culprit is always named (least progress, when nothing stronger shows).
    """
    for rule in INSTANCE_RULES:
        culprit = rule(evidence)
        if culprit is not None:
            return culprit
    if not isinstance(evidence, TaskEvidence):
        return None
    for task_rule in TASK_RULES:
        culprit = task_rule(evidence)
        if culprit is not None:
            return culprit
    return _least_progress(evidence)


# --- what the rules see, also for the callers that explain a verdict --------------------------


def down_runners(evidence: Evidence) -> list[RunnerInfo]:
    """Runners down while the task ran, in log order; for an ended task, those stopped before
    it ended and those failed before it ended or, when the instance broke with it, at any time
    since (nothing else ran on it). After a task ended its instance is retired and its runners
    stopped on purpose: those stops are not evidence."""
    story_end = evidence.story_end_seq
    if story_end is None:
        return [r for r in evidence.instance.runners if r.down]
    assert evidence.task is not None  # an ended story is a task's
    ended = evidence.task.ended_seq
    failed_until = None if evidence.broke_with_task else ended
    return [
        r
        for r in evidence.instance.runners
        if (r.status == "stopped" and r.changed_seq <= ended)
        or (r.status == "failed" and (failed_until is None or r.changed_seq <= failed_until))
    ]


def prefill_positions(evidence: Evidence) -> dict[int, int]:
    """The prefill iteration each rank still in its real chunks last reached, by rank."""
    return {v.rank: v.iteration for v in evidence.views if v.iteration is not None and not v.prefill_done}


def stalled_views(evidence: Evidence) -> list[RankView]:
    """Ranks in one phase (other than idle) past the bound, whatever they wait for."""
    limit = evidence.bounds.phase_s
    return [v for v in evidence.views if v.phase_age_s is not None and v.phase != "idle" and v.phase_age_s >= limit]


# --- the rules, most direct evidence first -------------------------------------------------------


def _node_gone(evidence: Evidence) -> Culprit | None:
    """The node of a rank timed out or left (within the story, for an ended task: a node that
    left at shutdown long after the task failed did not fail it). An ended task is also blamed
    on a node that has come back since, if its outage overlapped the task's run, in log order."""
    gone = [r.rank for r in evidence.instance.runners if _away_for(evidence, evidence.state.nodes.get(r.node_id))]
    return Culprit(ranks=tuple(gone), cause="node_gone") if gone else None


def _away_for(evidence: Evidence, node: NodeInfo | None) -> bool:
    story_end = evidence.story_end_seq
    if node is None:
        return False
    if node.status != "up":
        return story_end is None or node.changed_seq <= story_end
    outage, task = node.last_outage, evidence.task
    if outage is None or task is None or story_end is None:
        return False
    return outage.at_seq <= story_end and outage.back_seq >= (task.assigned_seq or task.created_seq)


def _down(evidence: Evidence) -> Culprit | None:
    """A rank went down: the one killed, else one that went down on its own; the ranks that
    only lost a peer are its casualties. Casualties alone point at the ranks that never reported."""
    down = down_runners(evidence)
    if not down:
        return None
    killed = [r.rank for r in down if r.cause == "killed"]
    own = killed or [r.rank for r in down if r.cause != "peer_lost"]
    if own:
        followers = tuple(r.rank for r in down if r.rank not in own)
        return Culprit(ranks=tuple(own), cause="killed" if killed else "exited", followers=followers)
    casualties = tuple(r.rank for r in down)
    unreported = tuple(r.rank for r in evidence.instance.runners if r.rank not in casualties)
    return Culprit(ranks=unreported or casualties, cause="unreported", followers=casualties)


def _silent(evidence: Evidence) -> Culprit | None:
    if not evidence.heard:
        return None
    limit = evidence.bounds.silence_s
    silent = [v.rank for v in evidence.views if v.heartbeat_ago_s is None or v.heartbeat_ago_s > limit]
    return Culprit(ranks=tuple(silent), cause="silent") if silent else None


def _diverged(evidence: TaskEvidence) -> Culprit | None:
    if evidence.task.chunks:
        return None
    positions = prefill_positions(evidence)
    if len(positions) < 2 or max(positions.values()) - min(positions.values()) < 2:
        return None
    low = min(positions.values())
    return Culprit(ranks=tuple(r for r, it in positions.items() if it == low), cause="diverged")


def _ignored_cancel(evidence: TaskEvidence) -> Culprit | None:
    """After a cancel, some ranks agreed to stop and others kept computing."""
    if evidence.task.cancel_reason is None or not evidence.heard:
        return None
    computing = [v.rank for v in evidence.views if v.phase in COMPUTE_PHASES]
    stopping = [v.rank for v in evidence.views if v.phase in STOPPING_PHASES]
    return Culprit(ranks=tuple(computing), cause="ignored_cancel") if computing and stopping else None


def _stalled(evidence: TaskEvidence) -> Culprit | None:
    stalled = stalled_views(evidence)
    if not stalled:
        return None
    compute = tuple(v.rank for v in stalled if not waits_in_collective(v.phase, v.stack))
    if compute:
        return Culprit(ranks=compute, cause="stalled_in_compute")
    return Culprit(ranks=tuple(v.rank for v in stalled), cause="stalled_in_collective")


def _cancel_pending(evidence: TaskEvidence) -> Culprit | None:
    if evidence.task.cancel_reason is None:
        return None
    working = tuple(v.rank for v in evidence.views if v.phase is None or v.phase in WORKING_PHASES)
    return Culprit(ranks=working or tuple(v.rank for v in evidence.views), cause="cancel_pending")


def _reported(evidence: TaskEvidence) -> Culprit | None:
    rank = evidence.task.failed_rank
    return Culprit(ranks=(rank,), cause="reported") if rank is not None else None


def _least_progress(evidence: Evidence) -> Culprit:
    """The ranks that never started the task, else those at the lowest iteration."""
    positions = {v.rank: v.iteration for v in evidence.views if v.iteration is not None}
    if not positions:
        return Culprit(ranks=tuple(v.rank for v in evidence.views), cause="least_progress")
    missing = tuple(v.rank for v in evidence.views if v.rank not in positions)
    low = min(positions.values())
    return Culprit(ranks=missing or tuple(r for r, it in positions.items() if it == low), cause="least_progress")


INSTANCE_RULES: tuple[InstanceRule, ...] = (_node_gone, _down, _silent)
TASK_RULES: tuple[TaskRule, ...] = (_diverged, _ignored_cancel, _stalled, _cancel_pending, _reported)
