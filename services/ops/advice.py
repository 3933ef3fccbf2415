"""What the operator should do next, per cause, and the reasons a task was never assigned.

Kept apart from the rules so the wording can be reviewed (and changed) in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from events.catalogue import RunnerHeartbeat
from events.evidence import RankView, ago, rank_views
from events.state import InstanceInfo, NodeInfo, State
from services.master.fair_share import handed_ahead, held_rows, not_started, room_of
from services.ops.findings import Cause, Finding
from services.ops.ranks import top_frame


def _where(views: list[RankView]) -> str:
    return ", ".join(f"rank {v.rank} on node {v.node_id}" for v in views) or "the instance's ranks"


def next_step(cause: Cause, instance: InstanceInfo, stuck: list[RankView], *, exited: bool = True) -> str:
    """`exited`: for rank_died, whether an exit was reported (else only the heartbeats stopped)."""
    where = _where(stuck)
    frames = "; ".join(top_frame(v.stack) for v in stuck if v.stack)
    at = f" (stuck at: {frames})" if frames else ""
    steps: dict[Cause, str] = {
        "rank_died": (
            f"Read the runner output of {where} for the exit (a traceback, or the OOM killer in `dmesg`). "
            f"Instance {instance.instance_id} cannot serve with a rank missing: retire it so the master places "
            "a new one, then resubmit the task."
            if exited
            else f"{where} stopped sending heartbeats but no exit was reported: on that node check whether the "
            "runner process is still there and frozen (`ps -o pid,stat,wchan` — T: stopped, D: stuck in I/O; "
            "`py-spy dump --pid`), swapping, or cut off from NATS. Kill it if it is wedged: the instance is "
            "retired and re-placed; resubmit the task."
        ),
        "stalled_in_compute": (
            f"{where} is alive but has not left its phase{at}. Check that node for memory pressure, swap or "
            "a throttled CPU/GPU; if it does not recover, fail the task and restart that runner."
        ),
        "stalled_in_collective": (
            f"{where} wait in a collective no peer completes{at}. Check ring connectivity between "
            f"{', '.join(instance.ring_hosts)} (firewall, addresses), then whether every rank issued the same "
            "collectives; restart the instance to recover."
        ),
        "iteration_mismatch": (
            "The ranks no longer issue the same sequence of sends/recvs: a decision was taken from one "
            "rank's local view. File a bug with this export (the stacks are in the finding) and restart "
            f"instance {instance.instance_id}; the group is not reusable."
        ),
        "cancel_ignored": (
            f"{where} never acted on the cancel: the stop was not agreed by every rank. Restart instance "
            f"{instance.instance_id} to free it and file a bug with this export."
        ),
        "node_timed_out": (
            f"The master lost {where}: check that machine and the network to it. The instance must be "
            "re-placed on live nodes; resubmit the task."
        ),
        "rank_error": (
            "Read the error above; if it names a bad request (prompt too long, bad parameter) fix the request, "
            f"otherwise read the runner output of {where}."
        ),
        "no_evidence": (
            "The log holds no heartbeat for this instance: export with the telemetry stream "
            "(`shoal events export` includes it unless trimmed by retention) or read the runner output of "
            f"{where} directly."
        ),
        "instance_not_ready": (
            f"{where} never reported ready: read the runner output there (model load errors, memory) and retire "
            f"instance {instance.instance_id} if it cannot load."
        ),
        "load_timed_out": (
            f"{where} did not finish loading within instance_ready_timeout_seconds{at}, so the master retired "
            f"instance {instance.instance_id} and failed the tasks waiting for it. On that node read the runner "
            "output and check the process (`ps -o pid,stat,wchan`: T = stopped, D = stuck in I/O), the disk and "
            "the network to the Hub; raise instance_ready_timeout_seconds if the model just loads slowly. The "
            "master places the model again after a backoff."
        ),
        "never_assigned": "See the reasons above.",
    }
    return steps[cause]


def unassigned_reasons(state: State, model: str) -> list[str]:
    """Why no instance took a task of `model`, most telling first."""
    candidates = [i for i in state.instances.values() if i.model == model]
    up = [n.node_id for n in state.nodes.values() if n.status == "up"]
    reasons: list[str] = []
    if not candidates:
        reasons.append(f"no instance of model {model!r} was ever placed")
    for instance in candidates:
        if instance.retired:
            reasons.append(f"instance {instance.instance_id} was retired ({instance.retire_reason})")
        elif not instance.ready:
            ranks = ", ".join(f"rank {r.rank}: {r.status}" for r in instance.runners)
            reasons.append(f"instance {instance.instance_id} was not ready ({ranks})")
        elif room_of(instance, state.tasks) == 0:
            ahead = not_started(instance, state.tasks)
            reasons.append(
                f"instance {instance.instance_id} was ready and full: it held {len(instance.queue)} tasks "
                f"({held_rows(instance, state.tasks)} rows: a task of n completions is n), {ahead} rows "
                f"of them not started (a batch of {instance.settings.batch_rows}, up to "
                f"{handed_ahead(instance.settings.batch_rows)} handed ahead); the task waits at the master for a "
                "place, other API keys' tasks first while they hold fewer (docs/ARCHITECTURE.md §5)"
            )
        else:
            reasons.append(f"instance {instance.instance_id} was ready but the master never assigned the task")
    reasons.append(f"{len(up)} node(s) up: {', '.join(sorted(up)) or 'none'}")
    return reasons


def unassigned_next_step(state: State, model: str) -> str:
    candidates = [i for i in state.instances.values() if i.model == model and not i.retired]
    if not any(n.status == "up" for n in state.nodes.values()):
        return "No node is up: start `shoal worker` on the machines (or `shoal up`) and resubmit."
    if not candidates:
        return f"Place an instance of {model!r} (check the master's placement log for why it did not) and resubmit."
    if not any(i.ready for i in candidates):
        return "Wait for the instance to become ready, or read its runners' output for a load failure."
    return "A ready instance existed: read the master's log for why it did not assign; restart the master."


def instance_finding(
    instance: InstanceInfo,
    cause: Cause,
    ranks: list[int],
    now_ns: int,
    beats: Mapping[int, RunnerHeartbeat] | None = None,
) -> Finding:
    runners = [instance.runners[r] for r in ranks]
    views = rank_views(None, instance, beats or {}, now_ns)
    stuck = [views[r] for r in ranks]
    evidence = tuple(f"rank {r.rank} on {r.node_id}: {r.status} {r.detail}".strip() for r in runners)
    summary = {
        "rank_died": f"instance {instance.instance_id}: rank(s) {ranks} failed or stopped",
        "instance_not_ready": f"instance {instance.instance_id}: rank(s) {ranks} never became ready",
        "load_timed_out": (
            f"instance {instance.instance_id} was retired by the loading deadline: rank(s) {ranks} still loading"
        ),
    }.get(cause, cause)
    return Finding(
        kind="instance",
        subject=instance.instance_id,
        cause=cause,
        summary=summary,
        next_step=next_step(cause, instance, stuck),
        status="retired" if instance.retired else "ready" if instance.ready else "not ready",
        instance_id=instance.instance_id,
        stuck_ranks=tuple(ranks),
        ranks=tuple(views),
        idle_s=ago(now_ns, max(r.changed_at for r in runners)),
        evidence=evidence,
    )


def node_finding(node: NodeInfo, hosted: Sequence[tuple[str, int]]) -> Finding:
    where = ", ".join(f"{instance} rank {rank}" for instance, rank in hosted)
    return Finding(
        kind="node",
        subject=node.node_id,
        cause="node_timed_out",
        summary=f"node {node.node_id} ({node.host}) timed out while hosting {where}",
        next_step=(
            f"Check machine {node.host} and the network to it; retire the instances it hosted ({where}) so "
            "they are re-placed on live nodes."
        ),
        status=node.status,
        instance_id=hosted[0][0],
        stuck_ranks=tuple(rank for _, rank in hosted),
        evidence=(node.reason,),
    )


# What to do about an event the fold quarantined, by the named error that refused it (events.apply).
_DANGLING = (
    "It names a task, instance or node no earlier event introduced: retention trimmed the event that did "
    "(harmless: it is skipped; raise events_max_age_seconds to keep more), or it was published without the "
    "events before it."
)
_QUARANTINE_STEPS: dict[str, str] = {
    "ForbiddenOrigin": (
        "The event claims a publisher that cannot have produced it: something on the bus forges events or "
        "publishes with another role's identity. `shoal events tail --from-seq {seq}` shows it with its origin; "
        "find that client, revoke its credentials, and keep the bus's per-role permissions on."
    ),
    "Misrouted": (
        "The event claims another node (or task, instance, kind) than the subject it was published on, which is "
        "the one thing the server checked against the publisher's identity: the node its subject names published "
        "it while claiming to be someone else. Take that node's seeds as stolen: `shoal events tail --from-seq "
        "{seq}` shows it; rotate the node's credentials and look at that machine."
    ),
    "UnknownTask": _DANGLING,
    "UnknownInstance": _DANGLING,
    "UnknownNode": _DANGLING,
    "InvalidEvent": (
        "It contradicts the log (a second creation of one id, a rank outside its instance): a forgery or a bug. "
        "Export the log (`shoal events export`) and file a bug with it."
    ),
}


def quarantine_findings(state: State) -> list[Finding]:
    """One finding per quarantined event the State kept (the newest; older ones are only counted)."""
    findings: list[Finding] = []
    dropped = state.quarantined_count - len(state.quarantined)
    for record in state.quarantined:
        evidence = [f"{record.error}: {record.reason}"]
        if dropped and not findings:
            evidence.append(f"{dropped} older quarantined event(s) are counted but not kept")
        step = _QUARANTINE_STEPS.get(record.error, _QUARANTINE_STEPS["InvalidEvent"])
        findings.append(
            Finding(
                kind="event",
                subject=f"seq {record.seq}",
                cause="quarantined_event",
                summary=f"{record.kind} at seq {record.seq} was refused by the fold and skipped ({record.error})",
                next_step=step.format(seq=record.seq),
                status="quarantined",
                evidence=tuple(evidence),
            )
        )
    return findings
