"""The instance view, for a terminal and as a page: one lane per rank, a bar per task it ran.

A lane has as many rows as the rank ran tasks at once (the batch); a bar's light part is the
task's prefill on that rank, its dark part the decode, a red outline a task that failed. The
page is self-contained SVG like the task's timeline (`render_html`), whose scale, axis and markers
it shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from services.ops.findings import Finding
from services.ops.instance_timeline import InstanceLane, InstanceTimeline, TaskBar
from services.ops.render_html import (
    HATCH_DEFS,
    LEFT,
    PLOT,
    RANK_COLOURS,
    STYLE,
    TOP,
    Scale,
    axis_svg,
    findings_html,
    marker_svg,
)
from services.ops.render_text import iso

ROW = 14  # one task's bar
LANE_PAD = 10


def instance_timeline_text(timeline: InstanceTimeline) -> str:
    head = (
        f"instance {timeline.instance_id}  model {timeline.model or '?'}  placed {iso(timeline.placed_wall_ns)}  "
        f"{timeline.tasks} tasks, at most {timeline.most_at_once} at once on a rank"
    )
    lines = [head]
    for lane in timeline.lanes:
        beat = lane.last_heartbeat
        where = f"; last heartbeat {beat.at_ms / 1000:+.3f}s in {beat.phase}" if beat is not None else ""
        batch = f", batch {', '.join(lane.batch)}" if lane.batch else ""
        kv = f", KV {lane.kv[0]:,} of {lane.kv[1]:,} tokens reserved" if lane.kv is not None else ""
        lines.append(f"rank {lane.rank}: {len(lane.bars)} tasks in {lane.rows} rows{where}{batch}{kv}")
        lines.extend(f"  row {bar.row:>2}  {_bar_text(bar)}" for bar in lane.bars)
    lines.extend(
        f"{m.at_ms / 1000:+10.3f}s  {'rank ' + str(m.rank) if m.rank is not None else '':<7} {m.text}"
        for m in timeline.markers
    )
    return "\n".join(lines)


def _bar_text(bar: TaskBar) -> str:
    prefill = f", prefill done {bar.prefill_done_ms / 1000:+.3f}s" if bar.prefill_done_ms is not None else ""
    return (
        f"{bar.task_id:<24} {bar.start_ms / 1000:+10.3f}s to {bar.end_ms / 1000:+10.3f}s{prefill}  "
        f"{bar.status}, {bar.tokens} tokens"
    )


def _lane_height(lane: InstanceLane) -> int:
    return max(1, lane.rows) * ROW + LANE_PAD


def _bar_svg(bar: TaskBar, y: float, scale: Scale, colour: str) -> list[str]:
    tip = escape(f"{bar.task_id}: {_bar_text(bar)}")
    split = bar.prefill_done_ms if bar.prefill_done_ms is not None else bar.end_ms
    outline = ' stroke="#dc2626" stroke-width="1.5"' if bar.status == "failed" else ""
    parts = [
        f'<rect class="task" x="{scale.x(bar.start_ms)}" y="{y}" width="{scale.width(bar.start_ms, bar.end_ms)}" '
        f'height="{ROW - 3}" fill="{colour}" fill-opacity="0.35"{outline}><title>{tip}</title></rect>'
    ]
    if split < bar.end_ms:
        parts.append(
            f'<rect class="decode" x="{scale.x(split)}" y="{y}" width="{scale.width(split, bar.end_ms)}" '
            f'height="{ROW - 3}" fill="{colour}"><title>{tip}</title></rect>'
        )
    return parts


def instance_svg(timeline: InstanceTimeline, stuck_ranks: Sequence[int] = ()) -> str:
    scale = Scale(0.0, timeline.end_ms)
    height = TOP + sum(_lane_height(lane) for lane in timeline.lanes) + 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + PLOT + 20}" height="{height}" role="img">']
    parts.append(HATCH_DEFS)
    y = TOP
    for lane in timeline.lanes:
        colour = RANK_COLOURS[lane.rank % len(RANK_COLOURS)]
        label = "#dc2626" if lane.rank in stuck_ranks else "#111"
        parts.append(f'<text class="lane-label" x="8" y="{y + 14}" fill="{label}">rank {lane.rank}</text>')
        for bar in lane.bars:
            parts.extend(_bar_svg(bar, y + 4 + bar.row * ROW, scale, colour))
        y += _lane_height(lane)
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT}" y1="{y}" y2="{y}" stroke="#e5e7eb"/>')
    for slot, marker in enumerate(timeline.markers):
        parts.extend(marker_svg(marker, scale, height, slot))
    parts.extend(axis_svg(scale, y + 2))
    parts.append("</svg>")
    return "\n".join(parts)


def render_instance_html(timeline: InstanceTimeline, findings: Sequence[Finding] = ()) -> str:
    """The whole page for one instance: header, lanes of task bars, its findings, its tasks."""
    stuck = sorted({rank for f in findings for rank in f.stuck_ranks})
    rows = "\n".join(
        f"<tr><td>rank {lane.rank}</td><td>row {bar.row}</td><td>{escape(_bar_text(bar))}</td></tr>"
        for lane in timeline.lanes
        for bar in lane.bars
    )
    title = f"shoal instance {timeline.instance_id}"
    diagnosis = findings_html(findings, "No findings: no rank is stuck and no task of it ended badly.")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<div class="meta">model {escape(timeline.model or "?")} · placed {iso(timeline.placed_wall_ns)} ·
{timeline.tasks} tasks, at most {timeline.most_at_once} at once · {timeline.end_ms / 1000:.3f}s shown</div>
{instance_svg(timeline, stuck)}
<h2>Diagnosis</h2>
{diagnosis}
<h2>Tasks</h2>
<table>{rows}</table>
</body></html>
"""
