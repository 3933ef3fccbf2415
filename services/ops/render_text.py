"""Plain-text views for a terminal: a task's timeline, the State at a point, the findings."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from events.evidence import ago
from events.state import State, TaskInfo
from services.ops.findings import Diagnosis, Finding
from services.ops.ranks import Heartbeats
from services.ops.timeline import Timeline

MAX_BAR_LINES = 400  # past this, a lane prints a summary: a 100k-token prompt has hundreds of chunks


def iso(wall_ns: int) -> str:
    return dt.datetime.fromtimestamp(wall_ns / 1e9, tz=dt.UTC).isoformat(timespec="milliseconds")


def _at(ms: float) -> str:
    return f"{ms / 1000:+10.3f}s"


def timeline_text(timeline: Timeline) -> str:
    head = (
        f"task {timeline.task_id}  model {timeline.model or '?'}  status {timeline.status}  "
        f"instance {timeline.instance_id or '-'}  created {iso(timeline.created_wall_ns)}"
    )
    rows: list[tuple[float, str]] = [(m.at_ms, _marker_row(m.rank, m.text)) for m in timeline.markers]
    for lane in timeline.lanes:
        if lane.started_ms is not None:
            what = f"prefill started: {lane.path}, {lane.prompt_tokens} tokens, {lane.chunks} chunks of {lane.step}"
            rows.append((lane.started_ms, _marker_row(lane.rank, what)))
        shown = lane.bars if len(lane.bars) <= MAX_BAR_LINES else lane.bars[-MAX_BAR_LINES:]
        if len(shown) < len(lane.bars):
            rows.append((lane.bars[0].start_ms, _marker_row(lane.rank, f"... {len(lane.bars) - len(shown)} chunks")))
        for bar in shown:
            took = (bar.end_ms - bar.start_ms) / 1000
            text = (
                f"iteration {bar.iteration:>4}  chunk {bar.chunk + 1}  {bar.processed}/{bar.total} tokens  {took:.3f}s"
            )
            rows.append((bar.end_ms, _marker_row(lane.rank, text)))
        if lane.done_ms is not None:
            rows.append((lane.done_ms, _marker_row(lane.rank, "prefill done")))
        if lane.last_heartbeat is not None:
            beat = lane.last_heartbeat
            text = f"last heartbeat: {beat.phase} iteration {beat.iteration}, in phase {beat.phase_age_ms / 1000:.1f}s"
            rows.append((beat.at_ms, _marker_row(lane.rank, text)))
    if timeline.decode is not None:
        d = timeline.decode
        seconds = (d.end_ms - d.start_ms) / 1000
        rate = f", {d.tokens / seconds:.1f} tokens/s" if seconds > 0 else ""
        rows.append(
            (d.end_ms, _marker_row(None, f"decode: {d.chunks} chunks, {d.tokens} tokens in {seconds:.3f}s{rate}"))
        )
    rows.sort(key=lambda row: row[0])
    return "\n".join([head, *(f"{_at(at)}  {text}" for at, text in rows)])


def _marker_row(rank: int | None, text: str) -> str:
    return f"{'rank ' + str(rank) if rank is not None else '':<7} {text}"


def state_text(state: State, beats: Heartbeats, reference_ns: int) -> str:
    lines = [f"State at event seq {state.last_seq} ({iso(reference_ns) if reference_ns else 'empty log'})", "nodes:"]
    for node in sorted(state.nodes.values(), key=lambda n: n.node_id):
        lines.append(f"  {node.node_id:<16} {node.host:<16} {node.status:<10} {node.backend} {node.reason}".rstrip())
    lines.append("instances:")
    for instance in sorted(state.instances.values(), key=lambda i: i.instance_id):
        flag = "retired" if instance.retired else "ready" if instance.ready else "not ready"
        lines.append(f"  {instance.instance_id}  {instance.model}  {instance.world_size} ranks  {flag}")
        for runner in instance.runners:
            beat = beats.latest.get((instance.instance_id, runner.rank))
            hb = f"  heartbeat {ago(reference_ns, beat.env.wall_time)}s ago: {beat.phase}" if beat else ""
            lines.append(f"    rank {runner.rank} on {runner.node_id}: {runner.status}{hb}")
        if instance.queue:
            lines.append(f"    queue: {', '.join(instance.queue)}")
    lines.extend(_tasks_text(state.tasks.values()))
    return "\n".join(lines)


def _tasks_text(tasks: Iterable[TaskInfo]) -> list[str]:
    live = sorted((t for t in tasks if not t.ended), key=lambda t: t.created_seq)
    ended: dict[str, int] = {}
    lines = ["tasks in flight:" if live else "tasks in flight: none"]
    for task in tasks:
        if task.ended:
            ended[task.status] = ended.get(task.status, 0) + 1
    for task in live:
        ranks = "  ".join(
            f"rank {r}: {p.processed}/{p.total} it {p.iteration}" for r, p in sorted(task.progress.items())
        )
        tokens = f"  {task.completion_tokens} tokens" if task.chunks else ""
        lines.append(f"  {task.task_id}  {task.status}  {task.instance_id or '-'}  {ranks}{tokens}".rstrip())
    if ended:
        lines.append("tasks ended: " + ", ".join(f"{count} {status}" for status, count in sorted(ended.items())))
    return lines


def finding_text(finding: Finding) -> str:
    lines = [f"[{finding.cause}] {finding.kind} {finding.subject}: {finding.summary}"]
    if finding.status:
        lines.append(f"  status: {finding.status}, last activity {finding.idle_s}s before the reference")
    for view in finding.ranks:
        mark = "*" if view.rank in finding.stuck_ranks else " "
        position = f"iteration {view.iteration}" if view.iteration is not None else "no iteration"
        tokens = f", {view.processed}/{view.total} tokens" if view.processed is not None else ""
        beat = f"heartbeat {view.heartbeat_ago_s}s ago" if view.heartbeat_ago_s is not None else "no heartbeat"
        age = f", in phase {view.phase_age_s}s" if view.phase_age_s is not None else ""
        lines.append(
            f" {mark} rank {view.rank} on {view.node_id}: runner {view.runner_status}, {view.phase_text} "
            f"{position}{tokens}, {beat}{age}"
        )
        if view.stack and view.rank in finding.stuck_ranks:
            lines.extend(f"      {line}" for line in view.stack.rstrip().splitlines())
    lines.extend(f"  - {item}" for item in finding.evidence)
    lines.append(f"  next: {finding.next_step}")
    return "\n".join(lines)


def diagnosis_text(diagnosis: Diagnosis) -> str:
    where = "the end of the log" if diagnosis.reference == "end_of_log" else "now"
    head = f"reference: {where} ({iso(diagnosis.reference_wall_ns)})" + _runs_text(diagnosis)
    if not diagnosis.findings:
        return f"{head}\nno findings: every task ended well and no instance is stuck"
    labelled = diagnosis.run > 0  # the log knows its runs: say which one each finding is from
    body = "\n\n".join((f"(run {f.run}) " if labelled else "") + finding_text(f) for f in diagnosis.findings)
    return f"{head}\n{len(diagnosis.findings)} finding(s)\n\n{body}"


def _runs_text(diagnosis: Diagnosis) -> str:
    if diagnosis.run == 0:
        return ""
    text = f"\ncurrent run: {diagnosis.run} (`shoal up` at {iso(diagnosis.run_started_wall_ns)})"
    if diagnosis.history:
        return text + "; findings of every run"
    if diagnosis.earlier_findings:
        return text + f"; {diagnosis.earlier_findings} finding(s) of earlier runs not shown (--history shows them)"
    return text
