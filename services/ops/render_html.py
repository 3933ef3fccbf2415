"""The timeline page: one self-contained HTML file, the waterfall drawn as inline SVG.

The SVG is generated here, so the page draws without JavaScript, fonts or a CDN — it opens from
a file on an air-gapped laptop as well as from `GET /debug/timeline`. One lane per rank holds a
bar per prefill chunk (idle iterations are the gaps), a decode lane spans first to last token,
and vertical markers show cancel / fail / stall; stuck ranks are outlined in red.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from services.ops.findings import Finding
from services.ops.render_text import finding_text, iso
from services.ops.timeline import Marker, RankLane, Timeline

LEFT = 120  # label column
PLOT = 1040
LANE = 34
TOP = 44
RANK_COLOURS = ("#3b82f6", "#10b981", "#f59e0b", "#8b5cf6", "#ec4899", "#14b8a6", "#f97316", "#6366f1")
MARKER_COLOURS = {
    "cancel": "#d97706",
    "failed": "#dc2626",
    "stalled": "#dc2626",
    "stack": "#b91c1c",
    "completed": "#059669",
    "first_token": "#2563eb",
}

STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#111;background:#fff}
h1{font-size:18px;margin:0 0 4px} h2{font-size:15px;margin:18px 0 6px} .meta{color:#555;margin-bottom:12px}
svg{border:1px solid #ddd;background:#fafafa} .lane-label{font:12px monospace}
.axis{font:11px monospace;fill:#666} .mlabel{font:11px sans-serif}
pre{background:#f4f4f5;padding:12px;white-space:pre-wrap;font-size:12px}
.finding{border-left:4px solid #dc2626;padding-left:10px;margin:12px 0}
.ok{border-left:4px solid #059669;padding-left:10px}
table{border-collapse:collapse;font-size:12px} td{padding:2px 10px 2px 0;font-family:monospace}
"""
HATCH_DEFS = (  # the fill of a stuck rank's stretch
    '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
    '<rect width="6" height="6" fill="#fee2e2"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#f87171" stroke-width="2"/>'
    "</pattern></defs>"
)


class Scale:
    """Maps a window of task time [start_ms, end_ms] onto the plot; outside it is clamped."""

    def __init__(self, start_ms: float, end_ms: float) -> None:
        self.start_ms = start_ms
        self.end_ms = max(end_ms, start_ms + 1.0)

    def x(self, ms: float) -> float:
        clamped = min(max(ms, self.start_ms), self.end_ms)
        return round(LEFT + (clamped - self.start_ms) / (self.end_ms - self.start_ms) * PLOT, 2)

    def width(self, start_ms: float, end_ms: float) -> float:
        width = self.x(end_ms) - self.x(start_ms)
        # A sub-pixel chunk still shows; wide ones leave a 1px seam so neighbouring chunks read apart.
        return round(max(1.0, width - 1 if width > 4 else width), 2)


def _lane_svg(lane: RankLane, row: int, scale: Scale, stuck: bool, end_ms: float) -> list[str]:
    y = TOP + row * LANE
    colour = RANK_COLOURS[lane.rank % len(RANK_COLOURS)]
    label_colour = "#dc2626" if stuck else "#111"
    parts = [f'<text class="lane-label" x="8" y="{y + 21}" fill="{label_colour}">rank {lane.rank}</text>']
    parts.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT}" y1="{y + LANE}" y2="{y + LANE}" stroke="#e5e7eb"/>')
    for bar in lane.bars:
        took = bar.end_ms - bar.start_ms
        tip = f"rank {lane.rank} iteration {bar.iteration} chunk {bar.chunk + 1}: "
        tip += f"{bar.processed}/{bar.total} tokens, {took:.1f} ms"
        width = scale.width(bar.start_ms, bar.end_ms)
        parts.append(
            f'<rect class="bar" x="{scale.x(bar.start_ms)}" y="{y + 6}" width="{width}" '
            f'height="{LANE - 12}" fill="{colour}"><title>{escape(tip)}</title></rect>'
        )
    if stuck:
        since = lane.bars[-1].end_ms if lane.bars else (lane.started_ms or 0.0)
        parts.append(
            f'<rect class="stuck" x="{scale.x(since)}" y="{y + 4}" width="{scale.width(since, end_ms)}" '
            f'height="{LANE - 8}" fill="url(#hatch)" stroke="#dc2626">'
            f"<title>rank {lane.rank} stopped here</title></rect>"
        )
    if lane.first_stack is not None and scale.start_ms <= lane.first_stack.at_ms <= scale.end_ms:
        x = scale.x(lane.first_stack.at_ms)
        tip = f"flight recorder: stuck in {lane.first_stack.phase}\n{lane.first_stack.stack or ''}"
        parts.append(f'<path d="M{x},{y + 2} l5,8 l-10,0 z" fill="#b91c1c"><title>{escape(tip)}</title></path>')
    return parts


def _decode_svg(timeline: Timeline, row: int, scale: Scale) -> list[str]:
    y = TOP + row * LANE
    parts = [f'<text class="lane-label" x="8" y="{y + 21}">decode</text>']
    decode = timeline.decode
    if decode is not None:
        tip = f"decode: {decode.chunks} chunks, {decode.tokens} tokens"
        parts.append(
            f'<rect class="decode" x="{scale.x(decode.start_ms)}" y="{y + 6}" '
            f'width="{scale.width(decode.start_ms, decode.end_ms)}" height="{LANE - 12}" fill="#64748b">'
            f"<title>{escape(tip)}</title></rect>"
        )
    return parts


def marker_svg(marker: Marker, scale: Scale, height: int, slot: int) -> list[str]:
    colour = MARKER_COLOURS.get(marker.kind)
    if colour is None:
        return []
    x = scale.x(marker.at_ms)
    label_y = 14 + (slot % 2) * 14  # alternate two rows so neighbouring labels do not overlap
    return [
        f'<line class="marker" x1="{x}" x2="{x}" y1="{TOP - 6}" y2="{height - 20}" stroke="{colour}" '
        f'stroke-dasharray="4 3"><title>{escape(marker.text)}</title></line>',
        f'<text class="mlabel" x="{x + 3}" y="{label_y}" fill="{colour}">'
        f"{escape(marker.kind.replace('_', ' '))}</text>",
    ]


def axis_svg(scale: Scale, y: int) -> list[str]:
    parts: list[str] = []
    for i in range(11):
        ms = scale.start_ms + (scale.end_ms - scale.start_ms) * i / 10
        x = scale.x(ms)
        parts.append(f'<line x1="{x}" x2="{x}" y1="{y}" y2="{y + 4}" stroke="#999"/>')
        parts.append(f'<text class="axis" x="{x - 14}" y="{y + 16}">{ms / 1000:.3f}s</text>')
    return parts


def prefill_window(timeline: Timeline) -> tuple[float, float] | None:
    """The span of the prefill bars, when it is too small a part of the task to read bubbles in."""
    bars = [bar for lane in timeline.lanes for bar in lane.bars]
    if not bars:
        return None
    start, end = min(b.start_ms for b in bars), max(b.end_ms for b in bars)
    if end - start >= 0.3 * max(timeline.end_ms, 1.0):
        return None
    margin = (end - start) * 0.05
    return max(0.0, start - margin), end + margin


def timeline_svg(timeline: Timeline, stuck_ranks: Sequence[int] = (), window: tuple[float, float] | None = None) -> str:
    """The waterfall over `window` (default: the whole task) as one inline SVG element."""
    scale = Scale(*(window or (0.0, timeline.end_ms)))
    rows = len(timeline.lanes) + 1
    height = TOP + rows * LANE + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + PLOT + 20}" height="{height}" role="img">',
        HATCH_DEFS,
    ]
    for row, lane in enumerate(timeline.lanes):
        parts.extend(_lane_svg(lane, row, scale, lane.rank in stuck_ranks, timeline.end_ms))
    parts.extend(_decode_svg(timeline, len(timeline.lanes), scale))
    shown = [m for m in timeline.markers if scale.start_ms <= m.at_ms <= scale.end_ms]
    for slot, marker in enumerate(shown):
        parts.extend(marker_svg(marker, scale, height, slot))
    parts.extend(axis_svg(scale, TOP + rows * LANE + 2))
    parts.append("</svg>")
    return "\n".join(parts)


def findings_html(
    findings: Sequence[Finding], nothing: str = "No findings: nothing is stuck and the task did not end badly."
) -> str:
    if not findings:
        return f'<p class="ok">{escape(nothing)}</p>'
    blocks = [
        f'<div class="finding"><b>{escape(f.cause)}</b>: {escape(f.summary)}<br>'
        f"<b>Next:</b> {escape(f.next_step)}<pre>{escape(finding_text(f))}</pre></div>"
        for f in findings
    ]
    return "\n".join(blocks)


def _zoom_html(timeline: Timeline, stuck: Sequence[int]) -> str:
    window = prefill_window(timeline)
    if window is None:
        return ""
    head = f"<h2>Prefill, zoomed to {window[0] / 1000:.3f}s to {window[1] / 1000:.3f}s (gaps are idle iterations)</h2>"
    return f"{head}\n{timeline_svg(timeline, stuck, window)}"


def render_timeline_html(timeline: Timeline, findings: Sequence[Finding] = ()) -> str:
    """The whole page for one task: header, waterfall, events table and diagnosis."""
    stuck = sorted({rank for f in findings for rank in f.stuck_ranks})
    rows = "\n".join(
        f"<tr><td>{m.at_ms / 1000:+.3f}s</td><td>{'rank ' + str(m.rank) if m.rank is not None else ''}</td>"
        f"<td>{escape(m.text)}</td></tr>"
        for m in timeline.markers
    )
    title = f"shoal task {timeline.task_id}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<div class="meta">model {escape(timeline.model or "?")} · status <b>{escape(timeline.status)}</b> · instance
{escape(timeline.instance_id or "-")} · created {iso(timeline.created_wall_ns)} ·
{timeline.end_ms / 1000:.3f}s shown</div>
{timeline_svg(timeline, stuck)}
{_zoom_html(timeline, stuck)}
<h2>Diagnosis</h2>
{findings_html(findings)}
<h2>Events</h2>
<table>{rows}</table>
</body></html>
"""
