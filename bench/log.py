"""`shoal bench log`: append, replay and offline fold rates of the event log, with raw references.

One fresh nats-server (embedded, in a temp dir) unless `--nats-url` is given, with shoal's fsync
policy (`nats_sync_interval`, 1 s). With `--fsync` (recorded as `log-fsync`: an fsync per write
is slow, so that run takes fewer events) two more take the same appends in the same rounds:
one that fsyncs every write before acknowledging it (`always`) and one with nats-server's own
default (every 2 minutes): `fsync_always_cost` is what acknowledging only what is on disk would
cost the append, `fsync_1s_cost` what shoal's policy costs against nats-server's. Each round runs
the writers, then the readers, then the offline fold (`bench.log_sides` describes each side);
within writers and within readers the order rotates per round. Judged on medians:
- append within 2x of a raw nats-py publish: the median of the per-round `raw / append`;
- replay (our reader, decoded and folded) >= 100k events/s; offline fold >= 300k events/s.
Beside our reader, nats-py's own ordered consumer replays the same stream into the same fold,
in the same rounds: `replay_vs_nats_py` is what the hand-written protocol reader earns.
Every replayed State is checked against the in-memory fold of the same events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import log_sides as sides
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.rounds import rotated
from bench.stats import compare, summarize, target
from eventlog.log import EventLog
from events.catalogue import LogEvent
from events.codec import encode
from events.fold import fold
from events.state import State
from events.subjects import subject_for
from events.synthetic import synthetic_history
from services.config import resolve_config
from services.log_routing import configure_logging
from services.nats import EmbeddedNats
from services.nats_durability import JETSTREAM_SYNC_INTERVAL, NATS_DEFAULT_SYNC_INTERVAL, SYNC_ALWAYS

REPLAY_MIN = 100_000
FOLD_MIN = 300_000
APPEND_SLOWDOWN_MAX = 2.0
ABOUT = (
    f"synthetic events: acknowledged pipelined appends (fsync every {JETSTREAM_SYNC_INTERVAL}) vs a raw nats-py "
    "publish (with --fsync, also vs appends to servers that fsync each write and every 2 min, nats-server's "
    "default); replay from JetStream by our reader "
    "and by nats-py's ordered consumer (both decoded and folded); offline fold of an export"
)
SIZED = (
    Sized("--events", 100_000, 2_000, "events per measurement"),
    Sized("--rounds", 5, 2, "rounds; each runs every side once"),
)
# The appends to the side servers, by their fsync policy: each needs its own embedded server.
SYNC_SIDES = {"append_fsync_always_per_s": SYNC_ALWAYS, "append_fsync_2m_per_s": NATS_DEFAULT_SYNC_INTERVAL}
WRITERS = ("raw_nats_publish_per_s", "raw_js_publish_async_per_s", "append_per_s", *SYNC_SIDES)
READERS = ("replay_per_s", "replay_nats_py_per_s", "replay_iterator_per_s")
RATES = (*WRITERS, *READERS, "fold_per_s")
HEADLINE = (
    "append_per_s",
    "append_fsync_always_per_s",
    "fsync_always_cost",
    "fsync_1s_cost",
    "raw_nats_publish_per_s",
    "raw_over_append",
    "replay_per_s",
    "replay_nats_py_per_s",
    "replay_vs_nats_py",
    "fold_per_s",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--nats-url", default=None, help="use this server (its SHOAL_* streams are reset!)")
    parser.add_argument(
        "--fsync",
        action="store_true",
        help="also append to embedded servers that fsync each write and every 2 min (not with --nats-url)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging(resolve_config().config)  # log_level from shoal.yaml / SHOAL_LOG_LEVEL, to stderr
    settings = resolve(args, SIZED)
    fsync = bool(getattr(args, "fsync", False))
    if fsync and args.nats_url:
        raise SystemExit("--fsync compares embedded servers' fsync policies: leave out --nats-url")
    with tempfile.TemporaryDirectory(prefix="shoal-bench-log-") as tmp:
        if args.nats_url:
            runs, checks = asyncio.run(_measure(args.nats_url, {}, settings, Path(tmp)))
        else:
            sides_of = SYNC_SIDES if fsync else {}
            with contextlib.ExitStack() as servers:
                url = servers.enter_context(EmbeddedNats(data_dir=tmp, port=0)).url
                sides_urls = {
                    name: servers.enter_context(EmbeddedNats(data_dir=Path(tmp) / name, port=0, sync_interval=sync)).url
                    for name, sync in sides_of.items()
                }
                runs, checks = asyncio.run(_measure(url, sides_urls, settings, Path(tmp)))
    return _report(settings, runs, checks, quick=bool(args.quick), variant="fsync" if fsync else "")


async def _measure(
    url: str, sync_urls: dict[str, str], settings: dict[str, Any], tmp: Path
) -> tuple[dict[str, list[float]], dict[str, bool]]:
    """`sync_urls`: the side servers of `SYNC_SIDES` by side (none with `--nats-url`)."""
    count = max(1000, int(settings["events"]))
    events: list[LogEvent] = synthetic_history(count, id_prefix=f"bench{time.time_ns()}")
    runs: dict[str, list[float]] = {name: [] for name in RATES if name not in SYNC_SIDES or name in sync_urls}
    checks: dict[str, bool] = {}
    gc.collect()
    gc.freeze()  # the benchmark's own inputs need not be scanned by every collection
    log = await EventLog.connect(url)
    side_logs = {name: await EventLog.connect(side_url) for name, side_url in sync_urls.items()}
    try:
        round_ = _Round(log, url, events, fold(enumerate(events, 1)), tmp, side_logs)
        for index in range(settings["rounds"]):
            for name, ok in (await round_.run(index, runs)).items():
                checks[name] = checks.get(name, True) and ok
        await sides.fresh(log)
    finally:
        await log.close()
        for side_log in side_logs.values():
            await side_log.close()
        gc.unfreeze()
    return runs, checks


class _Round:
    """One round: every writer on fresh streams, every reader on what they left, the offline fold."""

    def __init__(
        self, log: EventLog, url: str, events: list[LogEvent], live: State, tmp: Path, sides: dict[str, EventLog]
    ) -> None:
        self.log, self.url, self.events, self.live, self.tmp = log, url, events, live, tmp
        self.sides = sides
        self.frames = [(subject_for(e), encode(e), str(e.env.event_id)) for e in events]
        self.checks: dict[str, bool] = {}

    async def run(self, index: int, runs: dict[str, list[float]]) -> dict[str, bool]:
        self.checks = {}
        writers: dict[str, Callable[[], Awaitable[float]]] = {
            "raw_nats_publish_per_s": lambda: sides.raw_publish(self.url, self.frames),
            "raw_js_publish_async_per_s": lambda: sides.raw_js_publish_async(self.url, self.frames),
            "append_per_s": self._append,
            **{name: functools.partial(self._append_to_side, name) for name in self.sides},
        }
        readers: dict[str, Callable[[], Awaitable[float]]] = {
            "replay_per_s": lambda: self._read("replay", sides.replay(self.log, len(self.events))),
            "replay_nats_py_per_s": lambda: self._read(
                "replay_nats_py", sides.replay_nats_py(self.url, len(self.events))
            ),
            "replay_iterator_per_s": lambda: self._read("replay_iterator", sides.replay_iterator(self.log)),
        }
        for name in rotated([w for w in WRITERS if w in runs], index):
            if name not in SYNC_SIDES:  # those write to their own servers: this stream stays the readers'
                await sides.fresh(self.log)
            runs[name].append(await writers[name]())
        # Every writer stored the same messages; the last one's stream is what the readers read.
        self.checks["stream_holds_every_event"] = await sides.stored(self.log, len(self.events))
        for name in rotated(READERS, index):
            runs[name].append(await readers[name]())
        path = self.tmp / "export.jsonl"
        await sides.export(self.log, path)
        rate, offline = sides.offline_fold(path, len(self.events))
        runs["fold_per_s"].append(rate)
        self.checks["offline_state_equals_live"] = offline == self.live
        return self.checks

    async def _append(self) -> float:
        rate, seqs = await sides.append(self.log, self.events)
        self.checks["appended_once"] = seqs == list(range(1, len(self.events) + 1))
        return rate

    async def _append_to_side(self, name: str) -> float:
        """The same append on the side server `name` (its own fsync policy)."""
        log = self.sides[name]
        await sides.fresh(log)
        rate, seqs = await sides.append(log, self.events)
        self.checks[f"appended_once_{name.removesuffix('_per_s')}"] = seqs == list(range(1, len(self.events) + 1))
        return rate

    async def _read(self, name: str, reading: Awaitable[tuple[float, State]]) -> float:
        rate, state = await reading
        self.checks[f"{name}_state_equals_live"] = state == self.live
        return rate


def fold_account(per_s: float | None) -> str:
    """What bounds the offline fold: one Python thread decoding and applying each event in turn."""
    if not per_s:
        return "no fold was measured"
    return (
        f"one Python thread decodes (msgspec) and applies (`State.apply`) each event in turn: "
        f"{1e6 / per_s:.2f} us an event, against the {1e6 / FOLD_MIN:.2f} us the target allows"
    )


def _report(
    settings: dict[str, Any], runs: dict[str, list[float]], checks: dict[str, bool], quick: bool, variant: str
) -> dict[str, Any]:
    measures = {name: summarize(values, "events/s") for name, values in runs.items()}
    comparisons = {
        "raw_over_append": compare(
            runs["raw_nats_publish_per_s"], runs["append_per_s"], "ratio", "raw publish / append"
        ),
        "replay_vs_nats_py": compare(
            runs["replay_per_s"],
            runs["replay_nats_py_per_s"],
            "ratio",
            "our reader / nats-py ordered consumer (both decoded and folded)",
        ),
    }
    if set(SYNC_SIDES) <= set(runs):
        comparisons["fsync_always_cost"] = compare(
            runs["append_per_s"],
            runs["append_fsync_always_per_s"],
            "ratio",
            f"append with shoal's fsync (every {JETSTREAM_SYNC_INTERVAL}) / with fsync of each write (always)",
        )
        comparisons["fsync_1s_cost"] = compare(
            runs["append_fsync_2m_per_s"],
            runs["append_per_s"],
            "ratio",
            f"append with nats-server's default fsync (2 min) / with shoal's (every {JETSTREAM_SYNC_INTERVAL})",
        )
    targets = {
        "replay_per_s": target(measures["replay_per_s"]["median"], ">=", REPLAY_MIN, "events/s"),
        "fold_per_s": target(
            measures["fold_per_s"]["median"],
            ">=",
            FOLD_MIN,
            "events/s",
            bounded_by=fold_account(measures["fold_per_s"]["median"]),
        ),
        "raw_over_append": target(comparisons["raw_over_append"]["median"], "<=", APPEND_SLOWDOWN_MAX),
    }
    return bench_result(
        "log",
        variant=variant,
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        headline=[name for name in HEADLINE if name in measures or name in comparisons],
        checks=checks,
    )
