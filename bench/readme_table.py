"""README.md's benchmark section, rendered from the recorded results in `bench/results/` (pure).

The section between `START` and `END` is generated: one row per recorded file (its command,
the headline figures with their spread, each target and whether it was met, the commit and
machine that produced it) and the notes the benches wrote from their own figures. A test
renders it from the files and compares it with README.md, so a figure in the README can never
drift from the run that produced it. `shoal bench render-readme` rewrites it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.result import readable

START = "<!-- bench-table:start (rendered by `uv run shoal bench render-readme` from bench/results/; do not edit) -->"
END = "<!-- bench-table:end -->"
ORDER = ("log", "prefill", "e2e", "cancel", "replay")

INTRO = """\
Every row is a file in `bench/results/`, which also holds its machine, versions, BLAS and raw
samples. Each bench measures its sides in alternating rounds; a figure is the median with its
spread in brackets (p10..p90, or min..max under 10 samples) and n, and a ratio or difference is
the median of the per-round ones. Targets are judged in the JSON, on medians. To reproduce:
`uv run shoal bench all --record bench/results`, then `uv run shoal bench render-readme`."""


class MissingMarkers(ValueError):
    """README.md lacks the benchmark section's start/end comments."""


def render_readme(readme: str, records: Sequence[Mapping[str, Any]]) -> str:
    """`readme` with its benchmark section replaced by the one rendered from `records`."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise MissingMarkers(f"README.md needs the lines {START!r} and {END!r} around the benchmark table")
    return readme[: start + len(START)] + "\n" + render_section(records) + readme[end:]


def render_section(records: Sequence[Mapping[str, Any]]) -> str:
    ordered = sorted(records, key=_order)
    lines = [
        INTRO,
        "",
        "| command | what it measures | result: median [spread, n] | targets | recorded at |",
        "|---|---|---|---|---|",
    ]
    if not ordered:
        lines.append("| (no recorded runs yet) | | | | |")
    lines += [_row(record) for record in ordered]
    notes = [f"- {_title(record)}: {note}" for record in ordered for note in record.get("notes", [])]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"


def _order(record: Mapping[str, Any]) -> tuple[int, str, str]:
    bench = str(record["bench"])
    return (ORDER.index(bench) if bench in ORDER else len(ORDER), bench, str(record.get("variant", "")))


def _title(record: Mapping[str, Any]) -> str:
    variant = record.get("variant") or ""
    return f"{record['bench']} ({variant})" if variant else str(record["bench"])


def _row(record: Mapping[str, Any]) -> str:
    figures = {**record.get("measures", {}), **record.get("comparisons", {})}
    result = "<br>".join(_figure(name, figures[name]) for name in record.get("headline", []))
    targets = "<br>".join(_target(name, t) for name, t in record.get("targets", {}).items())
    command = f"uv run {record.get('command') or 'shoal bench ' + str(record['bench'])}"
    return f"| `{command}` | {record.get('about', '')} | {result} | {targets} | {_provenance(record)} |"


def _figure(name: str, summary: Mapping[str, Any]) -> str:
    unit = f" {summary['unit']}" if summary.get("unit") else ""
    median = summary.get("median")
    zeros = summary.get("zero_denominators") or 0  # absent from records before it was counted
    dropped = f", {zeros} of {summary['rounds']} rounds with a zero denominator" if zeros else ""
    if median is None:
        return f"`{name}` no samples{dropped}"
    low, high = ("p10", "p90") if "p10" in summary else ("min", "max")
    spread = f"{readable(summary[low])}..{readable(summary[high])}"
    extra = ""
    if "p99" in summary:
        p99 = summary["p99"]  # a number, or {value, is_max, ...} (`bench.stats`' tail with its caveat)
        value, is_max = (
            (p99["value"], p99.get("is_max")) if isinstance(p99, Mapping) else (p99, summary.get("p99_is_max"))
        )
        extra = f", p99 {readable(value)}{' (= max)' if is_max else ''}"
    return f"`{name}` {readable(median)}{unit} [{spread}, n={summary['n']}{extra}{dropped}]"


def _target(name: str, judged: Mapping[str, Any]) -> str:
    value = judged.get("value")
    shown = "none" if value is None else readable(value)
    verdict = "met" if judged.get("met") else "**not met**"
    note = f": {judged['note']}" if judged.get("note") and not judged.get("met") else ""  # what bounds it
    return f"`{name}` {judged['target']}: {verdict} ({shown}){note}"


def _provenance(record: Mapping[str, Any]) -> str:
    env = record.get("environment", {})
    commit = str(env.get("commit") or "unknown")[:7] + ("+dirty" if env.get("dirty") else "")
    load = env.get("load_avg_before") or ["?"]
    text = f"{commit}, {env.get('cpu_count', '?')}x {env.get('cpu_model', '?')}, load {load[0]}, {env.get('recorded_at', '?')}"
    return text + ("; **quick run: a placeholder to replace**" if record.get("quick") else "")
