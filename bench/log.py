"""`shoal bench log`: append, replay and offline fold rates of the event log, with a raw reference.

One run, one fresh nats-server (embedded, in a temp dir) unless `--nats-url` is given:
- `raw_nats_publish_per_s`: a bare nats-py `publish` of the same subjects, bytes and Nats-Msg-Id
  headers (no acknowledgement, no shoal code), timed to its final flush. The reference.
- `raw_js_publish_async_per_s`: nats-py's own acknowledged pipelined JetStream publish (context).
- `append_per_s`: `EventLog.append_many`, every append acknowledged by JetStream.
- `replay_per_s`: `EventLog.replay` from seq 1, each event decoded and folded with `apply`.
- `fold_per_s`: `fold_export` of a JSON Lines export file, offline (no NATS).
The replayed State is checked against the State folded from the events in memory.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

from events.apply import apply, fold
from events.catalogue import LogEvent
from events.codec import ExportRecord, encode
from events.export import fold_export, write_export
from events.log import EventLog
from events.state import State
from events.subjects import subject_for
from events.synthetic import synthetic_history
from services.nats import EmbeddedNats

TARGETS = {"replay_per_s": 100_000, "fold_per_s": 300_000, "append_vs_raw_max": 2.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=100_000, help="events per measurement (default 100000)")
    parser.add_argument("--nats-url", default=None, help="use this server (its SHOAL_* streams are reset!)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    count = max(1000, int(args.events))
    with tempfile.TemporaryDirectory(prefix="shoal-bench-log-") as tmp:
        if args.nats_url:
            return asyncio.run(_measure(args.nats_url, count, Path(tmp)))
        with EmbeddedNats(data_dir=tmp, port=0) as server:
            return asyncio.run(_measure(server.url, count, Path(tmp)))


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


async def _replay_fold(log: EventLog) -> tuple[float, State, int]:
    start = time.perf_counter()
    state = State()
    replayed = 0
    async for seq, event in log.replay(from_seq=1):
        state = apply(state, seq, event)
        replayed += 1
    return replayed / (time.perf_counter() - start), state, replayed


async def _export(log: EventLog, path: Path) -> None:
    with path.open("wb") as out:
        async for seq, event in log.replay(from_seq=1):
            write_export((ExportRecord(stream="events", seq=seq, event=event),), out)


def _offline_fold(path: Path, count: int) -> tuple[float, State]:
    start = time.perf_counter()
    state = fold_export(path)
    return count / (time.perf_counter() - start), state


async def _measure(url: str, count: int, tmp: Path) -> dict[str, Any]:
    events: list[LogEvent] = synthetic_history(count, id_prefix=f"bench{time.time_ns()}")
    frames = [(subject_for(e), encode(e), str(e.env.event_id)) for e in events]
    live = fold(enumerate(events, 1))
    gc.collect()
    gc.freeze()  # the benchmark's own inputs need not be scanned by every collection
    log = await EventLog.connect(url)
    try:
        await _fresh(log)
        raw = await _raw_publish(url, frames)
        await _fresh(log)
        raw_js = await _raw_js_publish_async(url, frames)
        await _fresh(log)
        start = time.perf_counter()
        seqs = await log.append_many(events)
        append = count / (time.perf_counter() - start)
        replay, replayed_state, replayed = await _replay_fold(log)
        path = tmp / "export.jsonl"
        await _export(log, path)
        fold_rate, offline_state = _offline_fold(path, count)
        await _fresh(log)
    finally:
        await log.close()
        gc.unfreeze()
    return _report(
        count,
        raw,
        raw_js,
        append,
        replay,
        fold_rate,
        checks={
            "appended_once": seqs == list(range(1, count + 1)),
            "replayed_all": replayed == count,
            "replay_state_equals_live": replayed_state == live,
            "offline_state_equals_live": offline_state == live,
        },
    )


def _report(
    count: int, raw: float, raw_js: float, append: float, replay: float, fold_rate: float, checks: dict[str, bool]
) -> dict[str, Any]:
    ratio = raw / append
    return {
        "bench": "log",
        "events": count,
        "append_per_s": round(append),
        "replay_per_s": round(replay),
        "fold_per_s": round(fold_rate),
        "raw_nats_publish_per_s": round(raw),
        "raw_js_publish_async_per_s": round(raw_js),
        "raw_over_append": round(ratio, 2),
        "targets": {
            "replay_per_s>=100k": replay >= TARGETS["replay_per_s"],
            "fold_per_s>=300k": fold_rate >= TARGETS["fold_per_s"],
            "append_within_2x_of_raw": ratio <= TARGETS["append_vs_raw_max"],
        },
        "checks": checks,
        "cpus": os.cpu_count(),
    }
