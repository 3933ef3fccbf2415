"""diagnose(state, heartbeats, now_ns) -> findings: which task or instance is stuck, where, and why.

Pure: the State is folded by the caller, the heartbeats are the newest per rank, and "now" is
injected (the wall clock live, the newest event of an export offline), so the same log always
gives the same findings.

A task is examined when it failed, or when it is unfinished and quiet past `Limits`. Its cause is
the first rule that matches, from the most direct evidence to the least:
node timed out > rank died > iteration mismatch > cancel split > stall > cancel not acted on >
rank error > no evidence. Instances and nodes get their own findings only when no task finding
already names them (an idle instance whose rank died; a node gone from under an instance).
"""

from __future__ import annotations

from collections.abc import Callable

from events.ids import NodeId
from events.state import InstanceInfo, RunnerInfo, State, TaskInfo
from services.ops import advice
from services.ops.findings import Cause, Finding, Limits, RankView
from services.ops.ranks import NS, WORKING_PHASES, Heartbeats, ago, prefill_done, rank_views, waits_in_collective

Rule = Callable[["TaskCase"], Finding | None]


class TaskCase:
    """Everything the rules need about one suspicious task on its instance."""

    def __init__(
        self, state: State, task: TaskInfo, instance: InstanceInfo, beats: Heartbeats, now_ns: int, limits: Limits
    ) -> None:
        self.state, self.task, self.instance, self.limits = state, task, instance, limits
        self.reference_ns = task.ended_at if task.ended else now_ns
        self.views = rank_views(task, instance, beats, self.reference_ns)
        self.has_heartbeats = any(v.heartbeat_ago_s is not None for v in self.views)

    def finding(
        self, cause: Cause, stuck: list[int], summary: str, evidence: list[str], *, exited: bool = True
    ) -> Finding:
        stuck_views = [self.views[rank] for rank in stuck]
        return Finding(
            kind="task",
            subject=self.task.task_id,
            cause=cause,
            summary=summary,
            next_step=advice.next_step(cause, self.instance, stuck_views, exited=exited),
            status=self.task.status,
            task_id=self.task.task_id,
            instance_id=self.instance.instance_id,
            stuck_ranks=tuple(stuck),
            ranks=self.views,
            idle_s=ago(self.reference_ns, self.task.last_activity_at),
            evidence=tuple(evidence),
        )

    def node_of(self, rank: int) -> NodeId:
        return self.instance.runners[rank].node_id


def diagnose(state: State, heartbeats: Heartbeats, now_ns: int, limits: Limits | None = None) -> list[Finding]:
    limits = limits or Limits()
    findings: list[Finding] = []
    named_instances: set[str] = set()
    for task in state.tasks.values():
        finding = diagnose_task(state, task, heartbeats, now_ns, limits)
        if finding is not None:
            findings.append(finding)
            if finding.instance_id is not None:
                named_instances.add(finding.instance_id)
    findings.extend(_instance_findings(state, now_ns, limits, named_instances))
    findings.extend(_node_findings(state, named_instances))
    return findings


def diagnose_task(state: State, task: TaskInfo, beats: Heartbeats, now_ns: int, limits: Limits) -> Finding | None:
    if not _suspicious(state, task, now_ns, limits):
        return None
    instance = state.instances.get(task.instance_id) if task.instance_id is not None else None
    if instance is None:
        return _never_assigned(state, task, now_ns)
    case = TaskCase(state, task, instance, beats, now_ns, limits)
    for rule in RULES:
        finding = rule(case)
        if finding is not None:
            return finding
    return _no_evidence(case)


def _suspicious(state: State, task: TaskInfo, now_ns: int, limits: Limits) -> bool:
    if task.status == "failed":
        return True
    if task.ended:
        return False
    if task.stalled:
        return True
    if task.instance_id is None:
        return now_ns - task.created_at > limits.assign_timeout_s * NS
    instance = state.instances.get(task.instance_id)
    if instance is not None and (instance.failed or instance.retired):
        return True
    if task.cancel_reason is not None and now_ns - task.cancelled_at > limits.cancel_grace_s * NS:
        return True
    return now_ns - task.last_activity_at > limits.stuck_after_s * NS


# --- rules, most direct evidence first -----------------------------------------------------------


def _node_timed_out(case: TaskCase) -> Finding | None:
    gone = [r.rank for r in case.instance.runners if _node_gone_in_time(case, r.node_id)]
    if not gone:
        return None
    nodes = sorted({case.node_of(rank) for rank in gone})
    evidence = [f"node {n}: {case.state.nodes[n].status} ({case.state.nodes[n].reason})" for n in nodes]
    return case.finding("node_timed_out", gone, f"node {', '.join(nodes)} hosting rank(s) {gone} went away", evidence)


def _rank_died(case: TaskCase) -> Finding | None:
    failed = _dead_runners(case)
    if failed:
        culprits = _culprits(failed)
        ranks = [r.rank for r in culprits]
        evidence = [f"rank {r.rank} runner {r.status}: {r.detail or 'no detail'}" for r in failed]
        followers = [r.rank for r in failed if r not in culprits]
        if followers:
            evidence.append(f"rank(s) {followers} failed after losing their peer: a consequence, not the cause")
        return case.finding("rank_died", ranks, f"rank(s) {ranks} of {case.instance.instance_id} died", evidence)
    if not case.has_heartbeats:
        return None
    timeout = case.limits.heartbeat_timeout_s
    if case.task.stalled:
        # The watchdog already gave up on the task: a rank silent a few beats while the others
        # kept beating is the one that stopped, even if the stall deadline is short.
        timeout = min(timeout, case.limits.stalled_task_silence_s)
    silent = [v.rank for v in case.views if v.heartbeat_ago_s is None or v.heartbeat_ago_s > timeout]
    if not silent:
        return None
    alive = [v.rank for v in case.views if v.rank not in silent]
    evidence = [f"rank {r}: {_heartbeat_text(case.views[r])}" for r in silent]
    evidence.append(f"rank(s) {alive} kept sending heartbeats" if alive else "no rank sent a heartbeat since")
    evidence.append("no exit of its process was reported: it may be frozen (stopped, swapping, stuck in C code)")
    summary = f"rank(s) {silent} stopped sending heartbeats"
    return case.finding("rank_died", silent, summary, evidence, exited=False)


# How long after a task ended a runner's failure still counts as part of its story: the worker's
# report of a killed rank can land just after the peer's own error already failed the task.
AFTERMATH_NS = 10 * NS
# Words of a runner's error that say it lost its peer (a consequence of another rank's death).
PEER_LOST_MARKERS = ("peer was lost", "connection reset", "broken pipe", "connection refused", "connection closed")


def _dead_runners(case: TaskCase) -> list[RunnerInfo]:
    """Runners failed or stopped while the task ran (or just after). After a task ended, its
    instance is retired and its runners stopped on purpose: those stops are not evidence."""
    end = case.task.ended_at if case.task.ended else None
    # A failure may be reported just after the end; a stop after the end is the teardown.
    grace = {"failed": AFTERMATH_NS, "stopped": 0}
    return [
        r for r in case.instance.runners if r.status in grace and (end is None or r.changed_at <= end + grace[r.status])
    ]


def _culprits(dead: list[RunnerInfo]) -> list[RunnerInfo]:
    """Of the dead ranks, those that died first: killed by a signal, else not merely orphaned."""
    killed = [r for r in dead if "killed by" in r.detail]
    if killed:
        return killed
    own = [r for r in dead if not any(marker in r.detail.lower() for marker in PEER_LOST_MARKERS)]
    return own or dead


def _iteration_mismatch(case: TaskCase) -> Finding | None:
    positions = {
        v.rank: v.iteration
        for v in case.views
        if v.iteration is not None and not prefill_done(case.task.progress.get(v.rank))
    }
    if len(positions) < 2 or case.task.chunks:
        return None
    low, high = min(positions.values()), max(positions.values())
    if high - low < 2:
        return None
    behind = [r for r, it in positions.items() if it == low]
    ahead = [r for r, it in positions.items() if it == high]
    evidence = [f"rank {r} last reached iteration {it}" for r, it in sorted(positions.items())]
    summary = f"rank(s) {ahead} ran {high - low} iterations ahead of rank(s) {behind}"
    return case.finding("iteration_mismatch", behind, summary, evidence)


def _cancel_split(case: TaskCase) -> Finding | None:
    """After a cancel, some ranks agreed to stop and others kept computing."""
    if case.task.cancel_reason is None or not case.has_heartbeats:
        return None
    working = [v.rank for v in case.views if v.phase in WORKING_PHASES and v.phase != "agree_start"]
    stopped = [v.rank for v in case.views if v.phase in ("agree_cancel", "idle")]
    if not working or not stopped:
        return None
    evidence = [f"rank {v.rank} in {v.phase} (iteration {v.iteration})" for v in case.views]
    summary = f"cancel ({case.task.cancel_reason}) acted on by rank(s) {stopped} but not by {working}"
    return case.finding("cancel_ignored", working, summary, evidence)


def _stall(case: TaskCase) -> Finding | None:
    threshold = case.limits.stall_phase_s
    if case.task.stalled:
        threshold = min(threshold, case.limits.stalled_task_phase_s)  # the watchdog already called it
    stalled = [v for v in case.views if _stalled(v, threshold)]
    if not stalled:
        return None
    compute = [v.rank for v in stalled if not waits_in_collective(v.phase, v.stack)]
    evidence = [f"rank {v.rank}: {v.phase} for {v.phase_age_s}s, {_heartbeat_text(v)}" for v in stalled]
    if compute:
        phase = case.views[compute[0]].phase
        summary = f"rank(s) {compute} stalled in compute in {phase}; the others wait for them"
        return case.finding("stalled_in_compute", compute, summary, evidence)
    ranks = [v.rank for v in stalled]
    return case.finding(
        "stalled_in_collective", ranks, f"rank(s) {ranks} wait in a collective that never completes", evidence
    )


def _cancel_not_acted(case: TaskCase) -> Finding | None:
    if case.task.cancel_reason is None:
        return None
    cancelled_ago = ago(case.reference_ns, case.task.cancelled_at)
    working = [v.rank for v in case.views if v.phase in WORKING_PHASES or v.phase == "waiting"]
    stuck = working or [v.rank for v in case.views]
    evidence = [f"cancel ({case.task.cancel_reason}) requested {cancelled_ago}s before the reference"]
    evidence += [f"rank {v.rank} in {v.phase}" for v in case.views]
    return case.finding(
        "cancel_ignored", stuck, f"cancel requested {cancelled_ago}s earlier was never completed", evidence
    )


def _rank_error(case: TaskCase) -> Finding | None:
    if case.task.status != "failed":
        return None
    stuck = [case.task.failed_rank] if case.task.failed_rank is not None else []
    evidence = [f"error: {case.task.error}"] + ([f"watchdog: {case.task.stalled}"] if case.task.stalled else [])
    return case.finding("rank_error", stuck, f"task failed: {case.task.error}", evidence)


def _no_evidence(case: TaskCase) -> Finding:
    quiet = ago(case.reference_ns, case.task.last_activity_at)
    evidence = [f"no event about the task for {quiet}s", "no heartbeat from any rank in the log"]
    if case.task.stalled:
        evidence.append(f"watchdog: {case.task.stalled}")
    return case.finding("no_evidence", [v.rank for v in case.views], f"task quiet for {quiet}s", evidence)


RULES: tuple[Rule, ...] = (
    _node_timed_out,
    _rank_died,
    _iteration_mismatch,
    _cancel_split,
    _stall,
    _cancel_not_acted,
    _rank_error,
)


def _stalled(view: RankView, threshold_s: float) -> bool:
    if view.phase_age_s is None or view.phase in ("idle", "ready"):
        return False
    return view.phase_age_s >= threshold_s


def _heartbeat_text(view: RankView) -> str:
    if view.heartbeat_ago_s is None:
        return "no heartbeat in the log"
    return f"last heartbeat {view.heartbeat_ago_s}s earlier in {view.phase} (iteration {view.iteration})"


def _node_gone_in_time(case: TaskCase, node_id: NodeId) -> bool:
    """The node timed out or left — before the task ended, for an ended task (a node that left
    at shutdown long after the task failed did not fail it)."""
    node = case.state.nodes.get(node_id)
    if node is None or node.status not in ("timed_out", "left"):
        return False
    return not case.task.ended or node.changed_at <= case.task.ended_at + AFTERMATH_NS


# --- tasks nobody took, instances and nodes ------------------------------------------------------


def _never_assigned(state: State, task: TaskInfo, now_ns: int) -> Finding:
    reasons = advice.unassigned_reasons(state, task.model)
    if task.error:
        reasons.insert(0, f"the task failed unassigned: {task.error}")
    reference = task.ended_at if task.ended else now_ns
    return Finding(
        kind="task",
        subject=task.task_id,
        cause="never_assigned",
        summary=f"task for model {task.model!r} was never assigned: {reasons[0]}",
        next_step=advice.unassigned_next_step(state, task.model),
        status=task.status,
        task_id=task.task_id,
        idle_s=ago(reference, task.created_at),
        evidence=tuple(reasons),
    )


def _instance_findings(state: State, now_ns: int, limits: Limits, named: set[str]) -> list[Finding]:
    findings: list[Finding] = []
    for instance in state.instances.values():
        if instance.retired or instance.instance_id in named:
            continue
        dead = [r.rank for r in instance.runners if r.status in ("failed", "stopped")]
        if dead:
            findings.append(advice.instance_finding(instance, "rank_died", dead, now_ns))
        elif not instance.ready and now_ns - instance.placed_at > limits.load_timeout_s * NS:
            waiting = [r.rank for r in instance.runners if r.status not in ("ready", "running")]
            findings.append(advice.instance_finding(instance, "instance_not_ready", waiting, now_ns))
        if findings and findings[-1].instance_id == instance.instance_id:
            named.add(instance.instance_id)
    return findings


def _node_findings(state: State, named: set[str]) -> list[Finding]:
    findings: list[Finding] = []
    for node in state.nodes.values():
        if node.status != "timed_out":
            continue
        hosted = [
            (i.instance_id, r.rank)
            for i in state.instances.values()
            if not i.retired and i.instance_id not in named
            for r in i.runners
            if r.node_id == node.node_id
        ]
        if hosted:
            findings.append(advice.node_finding(node, hosted))
    return findings
