"""`shoal bench log`: append, replay and offline fold rates of the event log, with a raw reference.

One run, one fresh nats-server (embedded, in a temp dir) unless `--nats-url` is given:
- `raw_nats_publish_per_s`: a bare nats-py `publish` of the same subjects, bytes and Nats-Msg-Id
  headers (no acknowledgement, no shoal code), timed to its final flush. The reference.
- `raw_js_publish_async_per_s`: nats-py's own acknowledged pipelined JetStream publish (context).
- `append_per_s`: `EventLog.append_many`, every append acknowledged by JetStream.
- `replay_per_s`: `EventLog.fold()` from seq 1: read from JetStream, each event decoded and folded
  with `apply` (batch by batch). `replay_iterator_per_s`: the same through the per-event
  `async for seq, event in log.replay()` iterator, folded by the caller.
- `fold_per_s`: `fold_export` of a JSON Lines export file, offline (no NATS).
Each rate is the best of `--repeat` runs (default 3), the `timeit` convention: on a shared machine
the slower runs measure other processes, not this code. `medians` and every run (`runs`) are
reported beside them. The replayed States are checked against the in-memory fold.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

from eventlog.export import fold_export, write_export
from eventlog.log import EventLog
from events.apply import apply, fold
from events.catalogue import LogEvent
from events.codec import ExportRecord, encode
from events.state import State
from events.subjects import subject_for
from events.synthetic import synthetic_history
from services.config import configure_logging, resolve_config
from services.nats import EmbeddedNats

TARGETS = {"replay_per_s": 100_000, "fold_per_s": 300_000, "append_vs_raw_max": 2.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=100_000, help="events per measurement (default 100000)")
    parser.add_argument("--nats-url", default=None, help="use this server (its SHOAL_* streams are reset!)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per rate; the best is reported (default 3)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging(resolve_config().config)  # log_level from shoal.yaml / SHOAL_LOG_LEVEL, to stderr
    count = max(1000, int(args.events))
    with tempfile.TemporaryDirectory(prefix="shoal-bench-log-") as tmp:
        repeat = max(1, int(args.repeat))
        if args.nats_url:
            return asyncio.run(_measure(args.nats_url, count, Path(tmp), repeat))
        with EmbeddedNats(data_dir=tmp, port=0) as server:
            return asyncio.run(_measure(server.url, count, Path(tmp), repeat))


async def _fresh(log: EventLog) -> None:
    await log.delete_streams()
    await log.ensure_streams()


async def _raw_publish(url: str, frames: list[tuple[str, bytes, str]]) -> float:
    nc = await nats.connect(url)
    try:
        start = time.perf_counter()
        for subject, payload, event_id in frames:
            await nc.publish(subject, payload, headers={"Nats-Msg-Id": event_id})
        await nc.flush(timeout=60)
        return len(frames) / (time.perf_counter() - start)
    finally:
        await nc.close()


async def _raw_js_publish_async(url: str, frames: list[tuple[str, bytes, str]]) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4096)
    try:
        start = time.perf_counter()
        futures = [await js.publish_async(s, p, headers={"Nats-Msg-Id": i}) for s, p, i in frames]
        await asyncio.gather(*futures)
        return len(frames) / (time.perf_counter() - start)
    finally:
        await nc.close()


async def _replay_fold(log: EventLog, count: int) -> tuple[float, State]:
    start = time.perf_counter()
    state = await log.fold()
    return count / (time.perf_counter() - start), state


async def _replay_iterator(log: EventLog) -> tuple[float, State]:
    start = time.perf_counter()
    state = State()
    replayed = 0
    async for seq, event in log.replay(from_seq=1):
        state = apply(state, seq, event)
        replayed += 1
    return replayed / (time.perf_counter() - start), state


async def _export(log: EventLog, path: Path) -> None:
    with path.open("wb") as out:
        async for seq, event in log.replay(from_seq=1):
            write_export((ExportRecord(stream="events", seq=seq, event=event),), out)


def _offline_fold(path: Path, count: int) -> tuple[float, State]:
    start = time.perf_counter()
    state = fold_export(path)
    return count / (time.perf_counter() - start), state


async def _measure(url: str, count: int, tmp: Path, repeat: int) -> dict[str, Any]:
    events: list[LogEvent] = synthetic_history(count, id_prefix=f"bench{time.time_ns()}")
    frames = [(subject_for(e), encode(e), str(e.env.event_id)) for e in events]
    live = fold(enumerate(events, 1))
    runs: dict[str, list[float]] = {name: [] for name in RATES}
    checks: dict[str, bool] = {}
    gc.collect()
    gc.freeze()  # the benchmark's own inputs need not be scanned by every collection
    log = await EventLog.connect(url)
    try:
        for _ in range(repeat):
            await _one_run(log, url, events, frames, live, tmp, runs, checks)
    finally:
        await log.close()
        gc.unfreeze()
    return _report(count, runs, checks)


RATES = ("append_per_s", "replay_per_s", "replay_iterator_per_s", "fold_per_s", "raw_nats_publish_per_s",
         "raw_js_publish_async_per_s")  # fmt: skip


async def _one_run(
    log: EventLog,
    url: str,
    events: list[LogEvent],
    frames: list[tuple[str, bytes, str]],
    live: State,
    tmp: Path,
    runs: dict[str, list[float]],
    checks: dict[str, bool],
) -> None:
    count = len(events)
    await _fresh(log)
    runs["raw_nats_publish_per_s"].append(await _raw_publish(url, frames))
    await _fresh(log)
    runs["raw_js_publish_async_per_s"].append(await _raw_js_publish_async(url, frames))
    await _fresh(log)
    start = time.perf_counter()
    seqs = await log.append_many(events)
    runs["append_per_s"].append(count / (time.perf_counter() - start))
    rate, replayed = await _replay_fold(log, count)
    runs["replay_per_s"].append(rate)
    rate, iterated = await _replay_iterator(log)
    runs["replay_iterator_per_s"].append(rate)
    path = tmp / "export.jsonl"
    await _export(log, path)
    rate, offline = _offline_fold(path, count)
    runs["fold_per_s"].append(rate)
    await _fresh(log)
    results = {
        "appended_once": seqs == list(range(1, count + 1)),
        "replay_state_equals_live": replayed == live and iterated == live,
        "offline_state_equals_live": offline == live,
    }
    for name, ok in results.items():
        checks[name] = checks.get(name, True) and ok


def _report(count: int, runs: dict[str, list[float]], checks: dict[str, bool]) -> dict[str, Any]:
    rates = {name: round(max(values)) for name, values in runs.items()}
    medians = {name: round(statistics.median(values)) for name, values in runs.items()}
    ratio = rates["raw_nats_publish_per_s"] / rates["append_per_s"]
    return {
        "bench": "log",
        "events": count,
        "statistic": f"best of {len(runs['append_per_s'])} runs (timeit convention); medians and runs below",
        **rates,
        "raw_over_append": round(ratio, 2),
        "targets": {
            "replay_per_s>=100k": rates["replay_per_s"] >= TARGETS["replay_per_s"],
            "fold_per_s>=300k": rates["fold_per_s"] >= TARGETS["fold_per_s"],
            "append_within_2x_of_raw": ratio <= TARGETS["append_vs_raw_max"],
        },
        "checks": checks,
        "medians": {
            **medians,
            "raw_over_append": round(medians["raw_nats_publish_per_s"] / medians["append_per_s"], 2),
        },
        "runs": {name: [round(v) for v in values] for name, values in runs.items()},
        "cpus": os.cpu_count(),
    }
