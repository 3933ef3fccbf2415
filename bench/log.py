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
- replay (our reader, decoded and folded) >= 100k events/s; offline fold >= 300k events/s;
- with `--tls` (recorded as `log-tls`), a second embedded server serving TLS only holds the same
  events, and our reader replays from it in the same rounds: `tls_replay_cost`, the median of the
  per-round plain / TLS replay rates, <= 1.5 (issue 43).
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

import msgspec

from bench import log_sides as sides
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.rounds import rotated
from bench.stats import compare, summarize, target
from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog
from eventlog.tls import TlsFiles
from events.catalogue import LogEvent
from events.codec import encode
from events.fold import fold
from events.state import State
from events.subjects import subject_for
from events.synthetic import synthetic_history
from services.config import resolve_config
from services.log_routing import configure_logging
from services.nats import EmbeddedNats
from services.nats_certs import CA_CERT, host_files, write_certs
from services.nats_durability import JETSTREAM_SYNC_INTERVAL, NATS_DEFAULT_SYNC_INTERVAL, SYNC_ALWAYS

REPLAY_MIN = 100_000
FOLD_MIN = 300_000
APPEND_SLOWDOWN_MAX = 2.0
TLS_REPLAY_COST_MAX = 1.5
TLS_HOST = "127.0.0.1"  # the embedded TLS server's certificate names the address the reader dials
ABOUT = (
    f"synthetic events: acknowledged pipelined appends (fsync every {JETSTREAM_SYNC_INTERVAL}) vs a raw nats-py "
    "publish (with --fsync, also vs appends to servers that fsync each write and every 2 min, nats-server's "
    "default); replay from JetStream by our reader "
    "and by nats-py's ordered consumer (both decoded and folded; with --tls, ours also from a server serving TLS "
    "only); offline fold of an export with its subjects, as `shoal events export` writes it"
)
SIZED = (
    Sized("--events", 100_000, 2_000, "events per measurement"),
    Sized("--rounds", 5, 2, "rounds; each runs every side once"),
)
# The appends to the side servers, by their fsync policy: each needs its own embedded server.
SYNC_SIDES = {"append_fsync_always_per_s": SYNC_ALWAYS, "append_fsync_2m_per_s": NATS_DEFAULT_SYNC_INTERVAL}
WRITERS = ("raw_nats_publish_per_s", "raw_js_publish_async_per_s", "append_per_s", *SYNC_SIDES)
READERS = ("replay_per_s", "replay_nats_py_per_s", "replay_iterator_per_s")
READ_AND_FOLD = ("replay_per_s", "fold_per_s", "replay_nats_py_per_s")  # replay_account's figures
TLS_READER = "replay_tls_per_s"  # with --tls: `replay` from a server that serves TLS only
# With --tls, each replay's server write system calls per event (plain, TLS): what the TLS side's
# cost is made of (`tls_account`).
SERVER_WRITES = {"replay_per_s": "replay_server_writes_per_event", TLS_READER: "replay_tls_server_writes_per_event"}
RATES = (*WRITERS, *READERS, TLS_READER, "fold_per_s")
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
    "replay_tls_per_s",
    "tls_replay_cost",
    "replay_server_writes_per_event",
    "replay_tls_server_writes_per_event",
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
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also replay from an embedded server that serves TLS only, holding the same events (not with --nats-url)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging(resolve_config().config)  # log_level from shoal.yaml / SHOAL_LOG_LEVEL, to stderr
    settings = resolve(args, SIZED)
    fsync = bool(getattr(args, "fsync", False))
    tls = bool(getattr(args, "tls", False))
    if (fsync or tls) and args.nats_url:
        raise SystemExit("--fsync and --tls compare embedded servers: leave out --nats-url")
    if fsync and tls:
        raise SystemExit("--fsync and --tls are separate records (log-fsync, log-tls): pass one of them")
    with tempfile.TemporaryDirectory(prefix="shoal-bench-log-") as tmp:
        if args.nats_url:
            runs, checks = asyncio.run(_measure(args.nats_url, {}, None, settings, Path(tmp)))
        else:
            sides_of = SYNC_SIDES if fsync else {}
            with contextlib.ExitStack() as servers:
                plain = servers.enter_context(EmbeddedNats(data_dir=tmp, port=0))
                url = plain.url
                sides_urls = {
                    name: servers.enter_context(EmbeddedNats(data_dir=Path(tmp) / name, port=0, sync_interval=sync)).url
                    for name, sync in sides_of.items()
                }
                tls_side = _tls_server(servers, Path(tmp), plain.pid) if tls else None
                runs, checks = asyncio.run(_measure(url, sides_urls, tls_side, settings, Path(tmp)))
    variant = "fsync" if fsync else "tls" if tls else ""
    return _report(settings, runs, checks, quick=bool(args.quick), variant=variant)


class TlsSide(msgspec.Struct, frozen=True, kw_only=True):
    """The TLS server's endpoint, and the process ids of the servers each replay reads from."""

    endpoint: NatsEndpoint
    pids: dict[str, int | None]  # reader -> its server's process id


def _tls_server(servers: contextlib.ExitStack, tmp: Path, plain_pid: int | None) -> TlsSide:
    """An embedded server serving TLS only, with a certificate from a private CA made here
    (`shoal nats certs`), and the endpoint that verifies it against that CA."""
    certs = tmp / "certs"
    write_certs(certs, [TLS_HOST])
    cert, key = (str(certs / name) for name in host_files(TLS_HOST))
    server = servers.enter_context(EmbeddedNats(data_dir=tmp / "tls", port=0, tls=TlsFiles(cert=cert, key=key)))
    endpoint = NatsEndpoint(url=server.url, tls=TlsFiles(ca=str(certs / CA_CERT)))
    return TlsSide(endpoint=endpoint, pids={"replay_per_s": plain_pid, TLS_READER: server.pid})


async def _measure(
    url: str, sync_urls: dict[str, str], tls: TlsSide | None, settings: dict[str, Any], tmp: Path
) -> tuple[dict[str, list[float]], dict[str, bool]]:
    """`sync_urls`: the side servers of `SYNC_SIDES` by side (none with `--nats-url`); `tls`: the
    TLS server, with `--tls`."""
    count = max(1000, int(settings["events"]))
    events: list[LogEvent] = synthetic_history(count, id_prefix=f"bench{time.time_ns()}")
    runs: dict[str, list[float]] = {
        name: []
        for name in RATES
        if (name not in SYNC_SIDES or name in sync_urls) and (name != TLS_READER or tls is not None)
    }
    checks: dict[str, bool] = {}
    gc.collect()
    gc.freeze()  # the benchmark's own inputs need not be scanned by every collection
    log = await EventLog.connect(url)
    side_logs = {name: await EventLog.connect(side_url) for name, side_url in sync_urls.items()}
    tls_log = await EventLog.connect(tls.endpoint) if tls is not None else None
    if tls_log is not None:  # filled once: the TLS side only reads
        await sides.fresh(tls_log)
        _rate, seqs = await sides.append(tls_log, events)
        checks["appended_once_tls"] = seqs == list(range(1, count + 1))
    try:
        round_ = _Round(log, url, events, fold(enumerate(events, 1)), tmp, side_logs, tls_log)
        round_.server_pids = tls.pids if tls is not None else {}
        for index in range(settings["rounds"]):
            for name, ok in (await round_.run(index, runs)).items():
                checks[name] = checks.get(name, True) and ok
        await sides.fresh(log)
    finally:
        await log.close()
        for side_log in side_logs.values():
            await side_log.close()
        if tls_log is not None:
            await tls_log.close()
        gc.unfreeze()
    return runs, checks


class _Round:
    """One round: every writer on fresh streams, every reader on what they left, the offline fold."""

    def __init__(
        self,
        log: EventLog,
        url: str,
        events: list[LogEvent],
        live: State,
        tmp: Path,
        sides: dict[str, EventLog],
        tls_log: EventLog | None,
    ) -> None:
        self.log, self.url, self.events, self.live, self.tmp = log, url, events, live, tmp
        self.sides = sides
        self.tls_log = tls_log
        self.server_pids: dict[str, int | None] = {}  # reader -> its server's pid, where writes are counted
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
        if self.tls_log is not None:
            tls_log = self.tls_log
            readers[TLS_READER] = lambda: self._read("replay_tls", sides.replay(tls_log, len(self.events)))
        for name in rotated([w for w in WRITERS if w in runs], index):
            if name not in SYNC_SIDES:  # those write to their own servers: this stream stays the readers'
                await sides.fresh(self.log)
            runs[name].append(await writers[name]())
        # Every writer stored the same messages; the last one's stream is what the readers read.
        self.checks["stream_holds_every_event"] = await sides.stored(self.log, len(self.events))
        for name in rotated([r for r in (*READERS, TLS_READER) if r in runs], index):
            pid = self.server_pids.get(name)
            before = sides.write_syscalls(pid) if pid is not None else None
            runs[name].append(await readers[name]())
            after = sides.write_syscalls(pid) if pid is not None else None
            if before is not None and after is not None:
                runs.setdefault(SERVER_WRITES[name], []).append(round((after - before) / len(self.events), 4))
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


def replay_account(measures: dict[str, Any]) -> str:
    """What bounds the replay, from this run's medians: it reads every event from the server and
    folds it in one Python thread, so its time per event is the fold's plus the read's."""
    replay, fold_rate, nats_py = (measures.get(name, {}).get("median") for name in READ_AND_FOLD)
    if not replay or not fold_rate:
        return "no replay or no fold was measured"
    per_event, folding = 1e6 / replay, 1e6 / fold_rate
    beside = f"; nats-py's ordered consumer into the same fold took {1e6 / nats_py:.2f} us" if nats_py else ""
    return (
        f"one Python thread reads each event from the server and folds it: {per_event:.2f} us an event, of which "
        f"the fold alone (decode and apply) is {folding:.2f} us and the read the other {per_event - folding:.2f} us, "
        f"against the {1e6 / REPLAY_MIN:.2f} us the target allows{beside}"
    )


def append_account(measures: dict[str, Any]) -> str:
    """What an append pays on top of a raw publish: an acknowledgement from JetStream per event."""
    raw, acked = (measures.get(name, {}).get("median") for name in ("raw_nats_publish_per_s", "append_per_s"))
    if not raw or not acked:
        return "no append or no raw publish was measured"
    return (
        f"an append waits for JetStream to store and acknowledge each event (pipelined): {1e6 / acked:.2f} us an "
        f"event against a raw publish's {1e6 / raw:.2f} us, which nothing stores or answers; both share the server "
        "and this machine's cores with the client"
    )


def tls_account(measures: dict[str, Any]) -> str:
    """What a TLS replay pays on top of plain text, from the server write calls counted per event."""
    plain, tls = (measures.get(name, {}).get("median") for name in SERVER_WRITES.values())
    if plain is None or tls is None:
        return "the servers' write system calls could not be counted here (no /proc): no account"
    return (
        f"the server made {tls:.3g} write system calls per event replayed over TLS against {plain:.3g} in plain "
        "text: nats-server writes each pooled outbound buffer (512 B for a message this size) as its own TLS "
        "record, one write each, where plain text gathers them into one writev; the client decrypts each "
        "record apart (asyncio's SSL protocol, one SSL_read each)"
    )


def _report(
    settings: dict[str, Any], runs: dict[str, list[float]], checks: dict[str, bool], quick: bool, variant: str
) -> dict[str, Any]:
    writes = set(SERVER_WRITES.values())
    measures = {
        name: summarize(values, "writes/event" if name in writes else "events/s") for name, values in runs.items()
    }
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
    if TLS_READER in runs:
        comparisons["tls_replay_cost"] = compare(
            runs["replay_per_s"], runs[TLS_READER], "ratio", "replay in plain text / replay over TLS (same events)"
        )
    targets = {
        "replay_per_s": target(
            measures["replay_per_s"]["median"], ">=", REPLAY_MIN, "events/s", bounded_by=replay_account(measures)
        ),
        "fold_per_s": target(
            measures["fold_per_s"]["median"],
            ">=",
            FOLD_MIN,
            "events/s",
            bounded_by=fold_account(measures["fold_per_s"]["median"]),
        ),
        "raw_over_append": target(
            comparisons["raw_over_append"]["median"], "<=", APPEND_SLOWDOWN_MAX, bounded_by=append_account(measures)
        ),
    }
    if "tls_replay_cost" in comparisons:
        targets["tls_replay_cost"] = target(
            comparisons["tls_replay_cost"]["median"],
            "<=",
            TLS_REPLAY_COST_MAX,
            bounded_by=tls_account(measures),
        )
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
