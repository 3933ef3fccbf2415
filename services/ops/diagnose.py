"""diagnose(state, heartbeats, now_ns) -> findings: which task or instance is stuck, where, and why.

Pure: the State is folded by the caller, the heartbeats are the newest per rank, and "now" is
injected (the wall clock live, the newest event of an export offline), so the same log always
gives the same findings.

A task is examined when it failed, or when it is unfinished and quiet past `Limits`. Which ranks
are to blame, and why, is `events.culprit.name_culprit`: the very judgment the master's watchdog
makes when it gives a task up, so from the same evidence both name the same ranks. This module
turns that verdict into a finding: its cause, a summary, the evidence and the next step.
Instances and nodes get their own findings only when no task finding already names them (an idle
instance whose rank died; a node gone from under an instance).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import assert_never

import msgspec

from events.catalogue import RunnerHeartbeat
from events.culprit import (
    DOWN_CAUSES,
    Culprit,
    Evidence,
    TaskEvidence,
    down_runners,
    name_culprit,
    prefill_positions,
    stalled_views,
)
from events.evidence import NS, RankView, ago
from events.ids import NodeId
from events.state import InstanceInfo, NodeInfo, State, TaskInfo
from events.vocabulary import SERVING_STATUSES, STOPPING_PHASES
from services.ops import advice
from services.ops.findings import Cause, Finding, Limits
from services.ops.ranks import Heartbeats
from services.worker.runner_logs import runner_log_name


class TaskCase:
    """Everything a finding needs about one suspicious task on its instance."""

    def __init__(
        self, state: State, task: TaskInfo, instance: InstanceInfo, beats: Heartbeats, now_ns: int, limits: Limits
    ) -> None:
        self.state, self.task, self.instance = state, task, instance
        self.reference_ns = task.ended_at if task.ended else now_ns
        by_rank = beats.for_task(task, instance)
        bounds = limits.bounds(stalled=bool(task.stalled) or _in_stalled_batch(task, instance, by_rank))
        # An ended task's ranks' silences on their peers' clocks: its end is stamped on another host.
        silences = beats.silences(task, instance) if task.ended else None
        self.evidence = TaskEvidence.about_task(state, instance, task, by_rank, self.reference_ns, bounds, silences)
        self.views = self.evidence.views
        self.batch_mates = sorted({t for beat in by_rank.values() for t in beat.tasks} - {task.task_id})

    def finding(
        self, cause: Cause, culprit: Culprit, summary: str, evidence: list[str], *, exited: bool = True
    ) -> Finding:
        stuck_views = [self.views[rank] for rank in culprit.ranks]
        if self.batch_mates:  # the same ranks hold every task of the batch: each gets this finding
            evidence = [*evidence, f"in a batch with {', '.join(self.batch_mates)} on {self.instance.instance_id}"]
        evidence = [*evidence, *self.stderr_files(culprit.ranks)]
        return Finding(
            kind="task",
            subject=self.task.task_id,
            cause=cause,
            summary=summary,
            next_step=advice.next_step(cause, self.instance, stuck_views, exited=exited),
            status=self.task.status,
            task_id=self.task.task_id,
            instance_id=self.instance.instance_id,
            stuck_ranks=culprit.ranks,
            ranks=self.views,
            idle_s=ago(self.reference_ns, self.task.last_activity_at),
            evidence=tuple(evidence),
        )

    def node_of(self, rank: int) -> NodeId:
        return self.instance.runners[rank].node_id

    def stderr_files(self, ranks: tuple[int, ...]) -> list[str]:
        """Where each of `ranks` left its stderr (what the log cannot say: a traceback, a rank
        that ended the task without a word), as its node announced it; none for older nodes."""
        files: list[str] = []
        for rank in ranks:
            node = self.state.nodes.get(self.node_of(rank))
            if node is not None and node.runner_logs:
                path = PurePath(node.runner_logs) / runner_log_name(self.instance.instance_id, rank)
                files.append(f"rank {rank}'s stderr: {path} on host {node.host} (node {node.node_id})")
        return files


def _in_stalled_batch(task: TaskInfo, instance: InstanceInfo, by_rank: Mapping[int, RunnerHeartbeat]) -> bool:
    """The watchdog gave up the head of `task`'s batch (it marks only the head stalled): the same
    ranks held `task`, so it is judged as the head was."""
    return instance.retire_cause == "stalled" and any(task.task_id in beat.tasks for beat in by_rank.values())


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
    findings.extend(_instance_findings(state, heartbeats, now_ns, limits, named_instances))
    findings.extend(_node_findings(state, named_instances))
    findings.extend(advice.quarantine_findings(state))
    return findings


def diagnose_task(state: State, task: TaskInfo, beats: Heartbeats, now_ns: int, limits: Limits) -> Finding | None:
    if not _suspicious(state, task, now_ns, limits):
        return None
    instance = state.instances.get(task.instance_id) if task.instance_id is not None else None
    if instance is None:
        return _never_assigned(state, task, now_ns)
    case = TaskCase(state, task, instance, beats, now_ns, limits)
    return explain(case, name_culprit(case.evidence))


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


# --- a verdict, told ---------------------------------------------------------------------------


def explain(case: TaskCase, culprit: Culprit) -> Finding:
    match culprit.cause:
        case "node_gone":
            return _node_gone(case, culprit)
        case "killed" | "exited" | "unreported":
            return _rank_down(case, culprit)
        case "silent":
            return _rank_silent(case, culprit)
        case "diverged":
            return _diverged(case, culprit)
        case "ignored_cancel":
            return _cancel_split(case, culprit)
        case "stalled_in_compute" | "stalled_in_collective":
            return _stall(case, culprit)
        case "cancel_pending":
            return _cancel_not_acted(case, culprit)
        case "reported" | "least_progress":
            return _rank_error(case, culprit) if case.task.status == "failed" else _no_evidence(case, culprit)
        case _:  # pragma: no cover - basedpyright checks every cause is handled
            assert_never(culprit.cause)


def _node_gone(case: TaskCase, culprit: Culprit) -> Finding:
    nodes = sorted({case.node_of(rank) for rank in culprit.ranks})
    evidence = [f"node {n}: {_absence(case.state.nodes[n])}" for n in nodes]
    summary = f"node {', '.join(nodes)} hosting rank(s) {list(culprit.ranks)} went away"
    return case.finding("node_timed_out", culprit, summary, evidence)


def _absence(node: NodeInfo) -> str:
    outage = node.last_outage
    if node.status != "up" or outage is None:
        return f"{node.status} ({node.reason})"
    return f"{outage.status} ({outage.reason}), then up again"


def _rank_down(case: TaskCase, culprit: Culprit) -> Finding:
    ranks = list(culprit.ranks)
    evidence = [f"rank {r.rank} runner {r.status}: {r.detail or 'no detail'}" for r in down_runners(case.evidence)]
    if culprit.followers:
        followers = list(culprit.followers)
        evidence.append(f"rank(s) {followers} failed after losing their peer: a consequence, not the cause")
    if culprit.cause == "unreported":
        evidence.append(f"rank(s) {ranks} reported no exit of their own: their worker or node may be gone")
        summary = f"rank(s) {ranks} of {case.instance.instance_id} went away unreported"
        return case.finding("rank_died", culprit, summary, evidence, exited=False)
    return case.finding("rank_died", culprit, f"rank(s) {ranks} of {case.instance.instance_id} died", evidence)


def _rank_silent(case: TaskCase, culprit: Culprit) -> Finding:
    silent = list(culprit.ranks)
    alive = [v.rank for v in case.views if v.rank not in culprit.ranks]
    evidence = [f"rank {r}: {_heartbeat_text(case.views[r])}" for r in silent]
    evidence.append(f"rank(s) {alive} kept sending heartbeats" if alive else "no rank sent a heartbeat since")
    evidence.append("no exit of its process was reported: it may be frozen (stopped, swapping, stuck in C code)")
    summary = f"rank(s) {silent} stopped sending heartbeats"
    return case.finding("rank_died", culprit, summary, evidence, exited=False)


def _diverged(case: TaskCase, culprit: Culprit) -> Finding:
    positions = prefill_positions(case.evidence)
    low, high = min(positions.values()), max(positions.values())
    ahead = [r for r, it in positions.items() if it == high]
    evidence = [f"rank {r} last reached iteration {it}" for r, it in sorted(positions.items())]
    summary = f"rank(s) {ahead} ran {high - low} iterations ahead of rank(s) {list(culprit.ranks)}"
    return case.finding("iteration_mismatch", culprit, summary, evidence)


def _cancel_split(case: TaskCase, culprit: Culprit) -> Finding:
    stopped = [v.rank for v in case.views if v.phase in STOPPING_PHASES]
    evidence = [f"rank {v.rank} in {v.phase_text} (iteration {v.iteration})" for v in case.views]
    reason = case.task.cancel_reason
    summary = f"cancel ({reason}) acted on by rank(s) {stopped} but not by {list(culprit.ranks)}"
    return case.finding("cancel_ignored", culprit, summary, evidence)


def _stall(case: TaskCase, culprit: Culprit) -> Finding:
    ranks = list(culprit.ranks)
    evidence = [
        f"rank {v.rank}: {v.phase_text} for {v.phase_age_s}s, {_heartbeat_text(v)}"
        for v in stalled_views(case.evidence)
    ]
    if culprit.cause == "stalled_in_compute":
        summary = f"rank(s) {ranks} stalled in compute in {case.views[ranks[0]].phase_text}; the others wait for them"
        return case.finding("stalled_in_compute", culprit, summary, evidence)
    summary = f"rank(s) {ranks} wait in a collective that never completes"
    return case.finding("stalled_in_collective", culprit, summary, evidence)


def _cancel_not_acted(case: TaskCase, culprit: Culprit) -> Finding:
    cancelled_ago = ago(case.reference_ns, case.task.cancelled_at)
    evidence = [f"cancel ({case.task.cancel_reason}) requested {cancelled_ago}s before the reference"]
    evidence += [f"rank {v.rank} in {v.phase_text}" for v in case.views]
    summary = f"cancel requested {cancelled_ago}s earlier was never completed"
    return case.finding("cancel_ignored", culprit, summary, evidence)


def _rank_error(case: TaskCase, culprit: Culprit) -> Finding:
    evidence = [f"error: {case.task.error}"] + ([f"watchdog: {case.task.stalled}"] if case.task.stalled else [])
    return case.finding("rank_error", culprit, f"task failed: {case.task.error}", evidence)


def _no_evidence(case: TaskCase, culprit: Culprit) -> Finding:
    quiet = ago(case.reference_ns, case.task.last_activity_at)
    evidence = [f"no event about the task for {quiet}s", "no heartbeat from any rank in the log"]
    if case.task.stalled:
        evidence.append(f"watchdog: {case.task.stalled}")
    return case.finding("no_evidence", culprit, f"task quiet for {quiet}s", evidence)


def _heartbeat_text(view: RankView) -> str:
    if view.heartbeat_ago_s is None:
        return "no heartbeat in the log"
    return f"last heartbeat {view.heartbeat_ago_s}s earlier in {view.phase_text} (iteration {view.iteration})"


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


def _instance_findings(state: State, beats: Heartbeats, now_ns: int, limits: Limits, named: set[str]) -> list[Finding]:
    findings: list[Finding] = []
    for instance in state.instances.values():
        if instance.instance_id in named:
            continue
        if instance.retire_cause == "load_deadline":
            findings.append(_load_timed_out(instance, beats, now_ns))
        if instance.retired:
            continue
        bounds = limits.bounds(stalled=False)
        culprit = name_culprit(Evidence.about_instance(state, instance, beats.latest_of(instance), now_ns, bounds))
        if culprit is not None and culprit.cause in DOWN_CAUSES:
            findings.append(advice.instance_finding(instance, "rank_died", list(culprit.ranks), now_ns))
        elif not instance.ready and now_ns - instance.placed_at > limits.load_timeout_s * NS:
            waiting = [r.rank for r in instance.runners if r.status not in SERVING_STATUSES]
            findings.append(advice.instance_finding(instance, "instance_not_ready", waiting, now_ns))
        if findings and findings[-1].instance_id == instance.instance_id:
            named.add(instance.instance_id)
    return findings


def _load_timed_out(instance: InstanceInfo, beats: Heartbeats, now_ns: int) -> Finding:
    """The master's loading deadline retired `instance`: name the ranks it was still waiting for,
    with their heartbeats (a frozen rank's stopped; a rank in a long load keeps beating)."""
    loading = [r.rank for r in instance.runners if r.status not in SERVING_STATUSES]
    reference = instance.retired_at or now_ns
    finding = advice.instance_finding(instance, "load_timed_out", loading, reference, beats.latest_of(instance))
    return msgspec.structs.replace(finding, evidence=(instance.retire_reason, *finding.evidence))


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
