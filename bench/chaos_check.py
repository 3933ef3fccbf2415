"""The checker of a chaos run's whole history (pure): the exported log, the clients' own records,
the faults as they were applied, and what the run saw after the last heal. `violations` returns
every broken guarantee as a sentence (empty: all held):

- every task on the log ended (one that did not is pointed at its ranks' stderr files): completed with the full text its client got (the log's chunks, in
  index order, equal what the client received), cancelled by its client, or failed with a reason
  that its client was told and that `shoal diagnose` explains;
- no acknowledged event lost: every task id a client was given has its `TaskCreated` on the log,
  and the log's sequence has no hole;
- nothing decided twice: no task assigned twice, no chunk index twice, no task's text published
  from a node outside the instance it was assigned to;
- no client call longer than its bound (`call_bound`: the run's own base, plus each fault that
  held while it ran), and none cut off, nor gone silent (no keepalive for a few intervals), unless
  a fault hit the API while it ran; such a call's text is a prefix of its task's on the log;
- no service exited by itself; after the last heal every worker node is back `up` (on the log and
  at /healthz) and a request is served, each within the recovery bound.

It reads events by their types only (never by subject strings, which the bus may rename).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Literal

from events.catalogue import (
    ChunkGenerated,
    InstancePlaced,
    LogEvent,
    NodeJoined,
    NodeLeft,
    NodeTimedOut,
    TaskAssigned,
    TaskCompleted,
    TaskCreated,
    TaskFailed,
    TaskStalled,
)
from services.worker.runner_logs import runner_log_name

# silent: its client gave up on a stream that sent nothing, not even a keepalive, for a few
# keepalive intervals (`bench/chaos_client.py`): the client's verdict on its connection, not the task's.
Outcome = Literal["completed", "failed", "cancelled", "refused", "hung", "broken", "silent"]
# Faults that may cut a client's connection to the API mid-call (the API's process or its host).
API_PROCESS, API_HOST = "api", "control"


@dataclass
class ClientRecord:
    """One request as its client saw it; times in seconds since the chaos started (the nemesis's clock)."""

    number: int
    kind: str  # stream | plain | cancel | structured
    key: int
    started: float
    ended: float = 0.0
    bound: float = 0.0  # when its client gives up (outcome "hung"); the checker's bound is `call_bound`
    task_id: str = ""  # from x-shoal-task-id: the API acknowledged the task
    text: str = ""
    outcome: Outcome = "broken"
    status: int = 0
    error: str = ""


@dataclass(frozen=True)
class FaultWindow:
    """A fault as applied: from injection to the end of its heal (seconds since the chaos started)."""

    kind: str
    target: str
    start: float
    end: float
    detail: str = ""

    def hits_the_api(self) -> bool:
        return self.target == API_PROCESS or self.target == API_HOST or self.detail == API_HOST


@dataclass(frozen=True)
class Recovery:
    """After the last heal: when every worker node was `up` at /healthz and when a request was
    served (seconds after the last heal; None: never within the run's wait), and the bound both must meet."""

    bound: float
    nodes_up_after: float | None
    served_after: float | None


@dataclass
class TaskHistory:
    created: bool = False
    chunks: dict[int, str] = field(default_factory=dict)
    chunk_nodes: set[str] = field(default_factory=set)
    duplicate_chunks: int = 0
    assigned: list[str] = field(default_factory=list)  # instance ids, in log order
    ended: str = ""  # the first terminal event, as the fold takes it: completed | cancelled | failed
    reason: str = ""  # TaskFailed.error, else a TaskStalled diagnosis

    @property
    def text(self) -> str:
        return "".join(self.chunks[index] for index in sorted(self.chunks))


@dataclass
class History:
    """The log, folded for the checker."""

    tasks: dict[str, TaskHistory] = field(default_factory=dict)
    instance_nodes: dict[str, set[str]] = field(default_factory=dict)
    instance_ranks: dict[str, list[str]] = field(default_factory=dict)  # each rank's node, by rank
    runner_logs: dict[str, str] = field(default_factory=dict)  # where each node keeps its runners' stderr
    node_up: dict[str, bool] = field(default_factory=dict)  # by each node's last membership event
    seq_holes: list[tuple[int, int]] = field(default_factory=list)  # (after, next) where seqs skip
    malformed: list[int] = field(default_factory=list)  # seqs of messages that decode to no event


def fold_history(records: Iterable[tuple[int, LogEvent | None]]) -> History:
    """The log's (seq, event) in order; None for a message that is no event."""
    history = History()
    last_seq = 0
    for seq, event in records:
        if last_seq and seq != last_seq + 1:
            history.seq_holes.append((last_seq, seq))
        last_seq = seq
        if event is None:
            history.malformed.append(seq)
        else:
            _take(history, event)
    return history


def _take(history: History, event: LogEvent) -> None:
    if isinstance(event, InstancePlaced):
        history.instance_nodes[event.instance_id] = {shard.node_id for shard in event.shards}
        history.instance_ranks[event.instance_id] = [shard.node_id for shard in event.shards]
    elif isinstance(event, NodeJoined):
        history.node_up[event.node_id] = True
        if event.runner_logs:
            history.runner_logs[event.node_id] = event.runner_logs
    elif isinstance(event, NodeTimedOut | NodeLeft):
        history.node_up[event.node_id] = False
    elif isinstance(event, TaskCreated | TaskAssigned | ChunkGenerated | TaskCompleted | TaskFailed | TaskStalled):
        _take_task(history.tasks.setdefault(event.task_id, TaskHistory()), event)


def _take_task(
    task: TaskHistory, event: TaskCreated | TaskAssigned | ChunkGenerated | TaskCompleted | TaskFailed | TaskStalled
) -> None:
    if isinstance(event, TaskCreated):
        task.created = True
    elif isinstance(event, TaskAssigned):
        task.assigned.append(event.instance_id)
    elif isinstance(event, ChunkGenerated):
        task.duplicate_chunks += event.index in task.chunks
        task.chunks[event.index] = event.text
        task.chunk_nodes.add(event.env.origin.node)
    elif isinstance(event, TaskCompleted):  # a later terminal event is a race the fold ignores
        task.ended = task.ended or ("cancelled" if event.finish_reason == "cancelled" else "completed")
    elif isinstance(event, TaskFailed):
        if not task.ended:
            task.ended, task.reason = "failed", event.error
    elif not task.reason:
        task.reason = event.diagnosis


@dataclass(frozen=True)
class Run:
    """Everything the checker judges."""

    history: History
    calls: Sequence[ClientRecord]
    faults: Sequence[FaultWindow]
    recovery: Recovery
    workers: Sequence[str]  # the worker node ids that must be up at the end
    base_bound: float  # the longest a call may take with no fault while it runs (`call_bound`)
    fault_grace: float  # what each fault during a call adds to its bound, beyond the fault's own length
    exits: Sequence[str] = ()  # services that exited while no fault of the nemesis had stopped them
    diagnosed: frozenset[str] | None = None  # task ids `shoal diagnose` has a finding for (None: not run)


def violations(run: Run) -> list[str]:
    found: list[str] = [f"a hole in the log: seq {a} is followed by {b}" for a, b in run.history.seq_holes]
    found += [f"a message on the log that is no event: seq {seq}" for seq in run.history.malformed]
    found += [f"service {name} exited by itself" for name in run.exits]
    for call in run.calls:
        found += _call_violations(call, run)
    for task_id, task in run.history.tasks.items():
        found += _task_violations(task_id, task, run)
    found += _recovery_violations(run)
    return found


def _call_violations(call: ClientRecord, run: Run) -> list[str]:
    name = f"request {call.number} ({call.kind}, task {call.task_id or '-'})"
    found: list[str] = []
    bound = call_bound(call, run)
    if call.outcome == "hung" or call.ended - call.started > bound:
        found.append(f"{name} took {call.ended - call.started:.1f}s, past its bound {bound:.0f}s ({call.outcome})")
    if call.outcome == "broken" and not _api_hit(call, run.faults):
        found.append(f"{name} was cut off with no fault on the API while it ran: {call.error}")
    if call.outcome == "silent" and not _api_hit(call, run.faults):  # a live API sends keepalives
        found.append(f"{name}: its connection went silent with no fault on the API while it ran: {call.error}")
    if not call.task_id:
        if call.outcome == "refused" and not (call.status in (429, 503) or call.status >= 500):
            found.append(f"{name} refused with {call.status}, not a server-side refusal: {call.error}")
        elif call.outcome == "refused" and not call.error.strip():
            found.append(f"{name} refused with {call.status} and no reason")
        elif call.outcome in ("completed", "failed", "cancelled"):
            found.append(f"{name} ended {call.outcome} without a task id")
        return found
    task = run.history.tasks.get(call.task_id)
    if task is None or not task.created:
        return [*found, f"{name}: acknowledged to its client, but no TaskCreated on the log"]
    return found + _agreement(name, call, task)


def call_bound(call: ClientRecord, run: Run) -> float:
    """How long `call` may take: the run's base bound, plus, for each fault that held while it
    ran, the fault's length and one grace (a fault can blind the master, whose deadlines then
    start again from its first sight of the task once it sees again)."""
    overlapping = [f for f in run.faults if f.start <= call.ended and f.end >= call.started]
    return run.base_bound + sum(f.end - f.start + run.fault_grace for f in overlapping)


def _agreement(name: str, call: ClientRecord, task: TaskHistory) -> list[str]:
    """The client's record against the log's, for a task both know."""
    if call.outcome == "completed":
        if task.ended != "completed":
            return [f"{name}: its client saw it complete, the log says {task.ended or 'not ended'}"]
        if task.text != call.text:
            return [f"{name}: the log's text {task.text!r} != the client's {call.text!r}"]
        return []
    if call.outcome == "failed":
        found = [] if call.error.strip() else [f"{name}: its client was told it failed, with no reason"]
        if task.ended == "completed":
            found.append(f"{name}: completed on the log, but its client was told it failed: {call.error}")
        return found + _prefix(name, call, task)
    if call.outcome == "cancelled":
        return _prefix(name, call, task)
    if call.outcome in ("broken", "hung", "silent"):
        return _prefix(name, call, task)
    return [f"{name}: given a task id, then refused ({call.status}): {call.error}"]


def _prefix(name: str, call: ClientRecord, task: TaskHistory) -> list[str]:
    if task.text.startswith(call.text):
        return []
    return [f"{name}: its client got {call.text!r}, not a prefix of the log's {task.text!r}"]


def _api_hit(call: ClientRecord, faults: Sequence[FaultWindow]) -> bool:
    return any(f.hits_the_api() and f.start <= call.ended and f.end >= call.started for f in faults)


def _task_violations(task_id: str, task: TaskHistory, run: Run) -> list[str]:
    found: list[str] = []
    if not task.created:
        found.append(f"task {task_id}: events on the log but no TaskCreated")
    if not task.ended:
        files = stderr_files(run.history, task.assigned[-1]) if task.assigned else []
        where = f"; its ranks' stderr: {', '.join(files)}" if files else ""
        found.append(f"task {task_id}: never ended on the log (neither completed, cancelled nor failed){where}")
    if task.ended == "failed":
        if not task.reason.strip():
            found.append(f"task {task_id}: failed without a reason")
        if run.diagnosed is not None and task_id not in run.diagnosed:
            found.append(f"task {task_id}: failed ({task.reason}), but `shoal diagnose` has no finding for it")
    if len(task.assigned) > 1:
        found.append(f"task {task_id}: assigned {len(task.assigned)} times ({', '.join(task.assigned)})")
    if task.duplicate_chunks:
        found.append(f"task {task_id}: {task.duplicate_chunks} chunk index(es) on the log twice")
    if task.assigned:
        allowed = run.history.instance_nodes.get(task.assigned[0], set())
        strangers = sorted(task.chunk_nodes - allowed)
        if strangers:
            found.append(f"task {task_id}: text published from {strangers}, outside its instance {task.assigned[0]}")
    elif task.chunks:
        found.append(f"task {task_id}: text on the log but never assigned")
    return found


def stderr_files(history: History, instance_id: str) -> list[str]:
    """The stderr file of each rank of `instance_id`, where its node announced a directory for them."""
    return [
        str(PurePath(history.runner_logs[node]) / runner_log_name(instance_id, rank))
        for rank, node in enumerate(history.instance_ranks.get(instance_id, []))
        if node in history.runner_logs
    ]


def _recovery_violations(run: Run) -> list[str]:
    found = [
        f"node {node} is not up at the end of the log" for node in run.workers if not run.history.node_up.get(node)
    ]
    recovery = run.recovery
    for what, after in (
        ("every node up at /healthz", recovery.nodes_up_after),
        ("a request served", recovery.served_after),
    ):
        if after is None or after > recovery.bound:
            seen = "never" if after is None else f"after {after:.1f}s"
            found.append(f"{what} {seen} after the last heal (bound {recovery.bound:.0f}s)")
    return found
