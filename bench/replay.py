"""`shoal bench replay`: offline fold and diagnose over a generated million-event log.

Generates the export (`bench.replay_log`), then measures from the file, in rounds whose
order rotates:
- read + decode alone, and read + decode + fold (records/s, by wall and by CPU time, which stays
  honest on a shared machine), so the fold's own share shows;
- `diagnose` in a fresh spawned child: wall and CPU time, peak memory (the child's `ru_maxrss`,
  which includes the interpreter: the baseline after imports is reported too);
and the flight recorder's overhead (`bench.recorder_overhead`).
Targets (issue 5), on medians: fold >= 300,000 events/s; diagnose on 1M events <= 5 s and
<= 1 GiB; the recorder at 1 Hz < 1% of the main thread.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import recorder_overhead
from bench.fresh import in_fresh_process
from bench.log import fold_account
from bench.options import Sized, add_sized, resolve
from bench.replay_log import generate
from bench.result import bench_result
from bench.rounds import run_rounds
from bench.stats import summarize, target
from services.ops.load import ExportReader
from services.ops.offline import diagnose_file
from services.ops.scan import scan

FOLD_MIN = 300_000
DIAGNOSE_MAX_S = 5.0
DIAGNOSE_MAX_MIB = 1024
RECORDER_MAX_PCT = 1.0
ABOUT = (
    "a generated log of ~1,000 records per task (2-rank tasks: prefill iterations, tokens, heartbeats): offline "
    "fold, `diagnose` in a fresh process, and the flight recorder's cost per heartbeat"
)
SIZED = (
    Sized("--tasks", 1000, 20, "tasks in the generated log (~1,000 records each)"),
    Sized("--rounds", 5, 2, "rounds of read, fold and diagnose"),
    Sized("--recorder-seconds", 1.5, 0.2, "length of each flight-recorder overhead run", float),
    Sized("--recorder-rounds", 5, 2, "rounds of the flight-recorder overhead runs"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--out", type=Path, help="keep the generated export here (default: a temporary file)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--skip-recorder", action="store_true", help="skip the flight-recorder overhead runs")


def _timed(action: Callable[[], Any]) -> tuple[Any, float, float]:
    """(result, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = action()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def read_decode(path: Path) -> dict[str, float]:
    records, wall, cpu = _timed(lambda: sum(1 for _ in ExportReader(path)))
    return {"records": records, "wall_s": wall, "cpu_s": cpu}


def read_decode_fold(path: Path) -> dict[str, Any]:
    result, wall, cpu = _timed(lambda: scan(ExportReader(path)))
    return {
        "records": result.records_read,
        "events_folded": result.events_folded,
        "heartbeats_indexed": result.heartbeats.count,
        "wall_s": wall,
        "cpu_s": cpu,
    }


def _diagnose_child(path: str, results: Any) -> None:
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    diagnosis, wall, cpu = _timed(lambda: diagnose_file(Path(path)))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    causes = sorted({f"{f.cause}:{f.subject}" for f in diagnosis.findings})
    results.put({"wall_s": wall, "cpu_s": cpu, "peak_kib": peak_kib, "baseline_kib": baseline_kib, "findings": causes})


def diagnose(path: Path) -> dict[str, Any]:
    return in_fresh_process(_diagnose_child, str(path))  # its peak is diagnose's own


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED) | {"seed": args.seed}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-replay-") as scratch:
        path: Path = args.out if args.out is not None else Path(scratch) / "log.jsonl"
        records, generate_s, _cpu = _timed(lambda: generate(path, settings["tasks"], settings["seed"]))
        file_mib = round(path.stat().st_size / (1 << 20), 1)
        samples = run_rounds(
            {
                "read_decode": lambda: read_decode(path),
                "read_decode_fold": lambda: read_decode_fold(path),
                "diagnose": lambda: diagnose(path),
            },
            settings["rounds"],
        )
    measures, checks = _fold_and_diagnose(samples, records)
    comparisons: dict[str, Any] = {}
    if not args.skip_recorder:
        recorder, comparisons = recorder_overhead.measure(settings["recorder_seconds"], settings["recorder_rounds"])
        measures |= recorder
    return bench_result(
        "replay",
        about=ABOUT,
        quick=bool(args.quick),
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=_targets(measures, records),
        headline=[
            name
            for name in (
                "fold_events_per_s",
                "diagnose_s",
                "diagnose_peak_rss_mib",
                "beat_cost_us",
                "bound_overhead_pct_1hz",
            )
            if name in measures
        ],
        checks=checks,
        details={
            "records_generated": records,
            "file_mib": file_mib,
            "generate_s": round(generate_s, 2),
            "findings": samples["diagnose"][0]["findings"],
            "events_folded": samples["read_decode_fold"][0]["events_folded"],
            "heartbeats_indexed": samples["read_decode_fold"][0]["heartbeats_indexed"],
        },
    )


def _fold_and_diagnose(samples: dict[str, list[Any]], records: int) -> tuple[dict[str, Any], dict[str, bool]]:
    decode, fold, diag = samples["read_decode"], samples["read_decode_fold"], samples["diagnose"]
    measures = {
        "fold_events_per_s": summarize([f["records"] / f["wall_s"] for f in fold], "events/s"),
        "fold_events_per_cpu_s": summarize([f["records"] / f["cpu_s"] for f in fold], "events/cpu-s"),
        "read_decode_per_cpu_s": summarize([d["records"] / d["cpu_s"] for d in decode], "events/cpu-s"),
        # Per round: the events folded over the CPU time the fold added to reading and decoding.
        "apply_only_events_per_cpu_s": summarize(
            [f["events_folded"] / max(1e-9, f["cpu_s"] - d["cpu_s"]) for f, d in zip(fold, decode, strict=True)],
            "events/cpu-s",
        ),
        "diagnose_s": summarize([d["wall_s"] for d in diag], "s"),
        "diagnose_cpu_s": summarize([d["cpu_s"] for d in diag], "s"),
        "diagnose_peak_rss_mib": summarize([d["peak_kib"] / 1024 for d in diag], "MiB"),
        "interpreter_baseline_rss_mib": summarize([d["baseline_kib"] / 1024 for d in diag], "MiB"),
    }
    checks = {
        "every_record_read": all(d["records"] == records for d in decode)
        and all(f["records"] == records for f in fold),
        "every_record_folded_or_indexed": all(f["events_folded"] + f["heartbeats_indexed"] == records for f in fold),
        "diagnose_finds_the_same_each_round": len({tuple(d["findings"]) for d in diag}) == 1,
    }
    return measures, checks


def diagnose_account(records: int, fold_per_s: float | None, diagnose_s: float | None) -> str:
    """What bounds `diagnose` of a whole log: it reads and folds every record in one Python thread."""
    if not fold_per_s or diagnose_s is None:
        return "no fold or no diagnose was measured"
    folding = records / fold_per_s
    return (
        f"diagnose reads and folds every record of the log in one Python thread: {records:,} records at the "
        f"fold's {1e6 / fold_per_s:.2f} us each (fold_events_per_s) are {folding:.2f} s of its {diagnose_s:.2f} s; "
        "it is as fast as the fold (see its target)"
    )


def _targets(measures: dict[str, Any], records: int) -> dict[str, Any]:
    def median(name: str) -> float | None:
        return measures[name]["median"] if name in measures else None

    diagnosed = diagnose_account(records, median("fold_events_per_s"), median("diagnose_s"))

    targets = {
        "fold_events_per_s": target(
            median("fold_events_per_s"),
            ">=",
            FOLD_MIN,
            "events/s",
            bounded_by=fold_account(median("fold_events_per_s")),
        ),
        "fold_events_per_cpu_s": target(
            median("fold_events_per_cpu_s"),
            ">=",
            FOLD_MIN,
            "events/cpu-s",
            bounded_by=fold_account(median("fold_events_per_cpu_s")),
        ),
        "diagnose_s": target(median("diagnose_s"), "<=", DIAGNOSE_MAX_S, "s", bounded_by=diagnosed),
        "diagnose_cpu_s": target(median("diagnose_cpu_s"), "<=", DIAGNOSE_MAX_S, "s", bounded_by=diagnosed),
        "diagnose_peak_rss_mib": target(median("diagnose_peak_rss_mib"), "<=", DIAGNOSE_MAX_MIB, "MiB"),
    }
    if "bound_overhead_pct_1hz" in measures:
        targets["recorder_overhead_pct_1hz"] = target(median("bound_overhead_pct_1hz"), "<=", RECORDER_MAX_PCT, "%")
    return targets
