"""`shoal bench soak`: start-up time and resident memory against the log's history (issue 9).

One fresh nats-server (embedded, in a temp dir). The log grows to each point (1k, 10k, 100k
finished tasks by default: a 1 kB prompt with stop strings and a 1 kB answer each, 4 events per
task, `events.synthetic.FinishedTasks`); at each point the leading master's snapshot is written
`--tail` tasks before the end, as a running cluster would have, and services are started in
fresh spawned processes (one round of each kind, whose order rotates, then `--rounds` - 1 more
of the snapshot start-up: the full folds take the bench's time and are only the contrast):
- `snapshot`: today's start-up — the stored snapshot plus the tail, keeping `--kept` ended tasks;
- `bounded_full`: the same bound, but no snapshot: the whole log folded (memory flat, time not);
- `unbounded`: no bound, no snapshot: every task held, as before retention (the contrast).
Each start-up reports its wall time (connect excluded: snapshot read + fold) and its resident
memory after a `gc.collect()` (`/proc/self/statm`), with the interpreter's own after imports.
Targets, on medians: from the smallest to the largest point the `snapshot` start-up grows by at
most 0.5 s and 32 MiB. Checks: every bounded start-up holds exactly the State the writer folded.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import os
import tempfile
import time
from typing import Any

from bench.fresh import in_fresh_process
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.rounds import run_rounds
from bench.stats import summarize, target
from eventlog.log import EventLog
from events.catalogue import LogEvent
from events.fold import Folder
from events.state import State, canonical_bytes
from events.synthetic import FinishedTasks
from services.nats import EmbeddedNats

MIB = 1 << 20
BATCH_TASKS = 5000
STARTUP_GROWTH_MAX_S = 0.5
RSS_GROWTH_MAX_MIB = 32.0
MODES = ("snapshot", "bounded_full", "unbounded")
ABOUT = (
    "start-up of a service (snapshot + tail, bounded State) against the number of finished tasks in the log, "
    "in fresh processes: wall time and resident memory, with the unbounded full fold for contrast"
)
SIZED = (
    Sized("--points", "1000,10000,100000", "200,2000", "finished tasks in the log at each point", str),
    Sized("--tail", 500, 50, "tasks appended after the newest snapshot (folded at start-up)"),
    Sized("--kept", 1000, 100, "finished_tasks_kept of the bounded start-ups"),
    Sized("--rounds", 3, 1, "start-ups from the snapshot per point (each full fold, the contrast, runs once)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB


def digest(state: State) -> str:
    return hashlib.sha256(canonical_bytes(state)).hexdigest()


def _start_up(url: str, mode: str, kept: int, results: Any) -> None:
    """A service's start-up in this fresh process; puts what it measured on `results`."""
    baseline = resident_mib()

    async def start() -> tuple[State, float]:
        log = await EventLog.connect(url, ensure=False)
        began = time.perf_counter()
        state = await log.fold(from_snapshot=mode == "snapshot", finished_tasks_kept=0 if mode == "unbounded" else kept)
        took = time.perf_counter() - began
        await log.close()
        return state, took

    state, took = asyncio.run(start())
    gc.collect()
    results.put(
        {
            "startup_s": took,
            "rss_mib": resident_mib(),
            "baseline_mib": baseline,
            "tasks_held": len(state.tasks),
            "last_seq": state.last_seq,
            "digest": digest(state) if mode != "unbounded" else "",
        }
    )


def start_up(url: str, mode: str, kept: int) -> dict[str, Any]:
    return in_fresh_process(_start_up, url, mode, kept)


class GrowingLog:
    """The log under test and the writer's own fold of it (what a master holds)."""

    def __init__(self, log: EventLog, kept: int) -> None:
        self.log = log
        self.supply = FinishedTasks()
        self.folder = Folder(State.keeping(kept))
        self.tasks = 0

    async def append(self, events: list[LogEvent]) -> None:
        seqs = await self.log.append_many(events)
        self.folder.add_all(zip(seqs, events, strict=True))

    async def grow_to(self, tasks: int) -> None:
        while self.tasks < tasks:
            batch = min(BATCH_TASKS, tasks - self.tasks)
            await self.append(self.supply.next(batch))
            self.tasks += batch


async def _measure(url: str, settings: dict[str, Any], points: list[int]) -> tuple[dict[int, Any], bool]:
    log = await EventLog.connect(url)
    await log.delete_streams()
    await log.ensure_streams()
    growing = GrowingLog(log, settings["kept"])
    await growing.append(growing.supply.cluster())
    by_point: dict[int, Any] = {}
    equal = True
    for point in points:
        await growing.grow_to(max(0, point - settings["tail"]))
        await log.write_snapshot(growing.folder.state)
        await growing.grow_to(point)
        expected = digest(growing.folder.state)
        sides = {mode: (lambda m=mode: start_up(url, m, settings["kept"])) for mode in MODES}
        samples = await asyncio.to_thread(run_rounds, sides, 1)
        more = await asyncio.to_thread(run_rounds, {"snapshot": sides["snapshot"]}, settings["rounds"] - 1)
        samples["snapshot"] += more["snapshot"]
        equal &= all(s["digest"] == expected for mode in ("snapshot", "bounded_full") for s in samples[mode])
        by_point[point] = samples
    await log.close()
    return by_point, equal


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED)
    points = sorted(int(p) for p in str(settings["points"]).split(","))
    with tempfile.TemporaryDirectory(prefix="shoal-bench-soak-") as tmp, EmbeddedNats(data_dir=tmp, port=0) as server:
        by_point, equal = asyncio.run(_measure(server.url, settings, points))
    measures: dict[str, Any] = {}
    for point, samples in by_point.items():
        for mode in MODES:
            measures[f"{mode}_startup_s_{point}"] = summarize([s["startup_s"] for s in samples[mode]], "s")
            measures[f"{mode}_rss_mib_{point}"] = summarize([s["rss_mib"] for s in samples[mode]], "MiB")
    measures["interpreter_baseline_rss_mib"] = summarize(
        [s["baseline_mib"] for samples in by_point.values() for mode in MODES for s in samples[mode]], "MiB"
    )
    low, high = points[0], points[-1]

    def growth(kind: str) -> float:
        return measures[f"snapshot_{kind}_{high}"]["median"] - measures[f"snapshot_{kind}_{low}"]["median"]

    held = {f"{mode}_{p}": by_point[p][mode][0]["tasks_held"] for p in points for mode in MODES}
    return bench_result(
        "soak",
        about=ABOUT,
        quick=bool(args.quick),
        settings=settings,
        measures=measures,
        comparisons={},
        targets={
            "snapshot_startup_growth_s": target(round(growth("startup_s"), 4), "<=", STARTUP_GROWTH_MAX_S, "s"),
            "snapshot_rss_growth_mib": target(round(growth("rss_mib"), 2), "<=", RSS_GROWTH_MAX_MIB, "MiB"),
        },
        headline=[f"{mode}_{kind}_{p}" for kind in ("startup_s", "rss_mib") for mode in MODES for p in (low, high)],
        checks={
            "bounded_start_ups_hold_the_writers_state": equal,
            "bounded_start_ups_hold_at_most_kept_ended_tasks": all(
                held[f"{mode}_{p}"] <= settings["kept"] for p in points for mode in ("snapshot", "bounded_full")
            ),
            "unbounded_start_ups_hold_every_task": all(held[f"unbounded_{p}"] == p for p in points),
        },
        details={"tasks_held": held, "events_per_task": 4},
    )
