"""`shoal bench chaos`: a seeded nemesis against a live workload across hosts, and the checker of
the whole history afterwards (issue 46).

The cluster (`bench/netcluster.py`, network-namespace hosts): three NATS servers (R3 streams), each
store on a small tmpfs of its own; two masters (one on the control host, one on a host of its
own); the API; three worker hosts, each model instance a pipeline across all three. Clients send
a steady workload from several API keys (streamed and not, cancelled mid-stream, short and long
prompts, structured output) while the schedule of `--seed` (`bench/chaos_schedule.py`, generated
whole up front and printed) injects one or two faults at a time (`bench/chaos_faults.py`) and
heals each before the next. After the last heal the run waits for every node to be `up` and a
request served, exports the log, asks `shoal diagnose` about it, and judges everything
(`bench/chaos_check.py`). A run with a violation prints its seed and schedule and exits 1.

Bounds are the run's own, never absolute: a client call may take the cluster's measured start-up
time plus twice the stall deadline, plus, for each fault that held while it ran, the fault's length
and one stall deadline (`chaos_check.call_bound`); recovery after the last heal, twice the start-up
time plus the stall deadline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.chaos_check import ClientRecord, FaultWindow, History, Recovery, Run, fold_history, violations
from bench.chaos_client import KEEPALIVE_S, TCP_KEEPALIVE, Clients, send
from bench.chaos_faults import Applied, Nemesis, clock_env
from bench.chaos_schedule import (
    FAULT_KINDS,
    FaultKind,
    RequestSpec,
    Schedule,
    Topology,
    make_schedule,
    workload,
)
from bench.cluster import shoal_argv
from bench.hosts import unavailable_reason
from bench.netcluster import API_KEY, FAST_SETTINGS, NetCluster
from bench.result import bench_result
from eventlog.export import write_export
from eventlog.log import EventLog
from events.catalogue import LogEvent
from events.codec import ExportRecord
from services.worker.runner_logs import RUNNER_LOGS_DIRNAME

ABOUT = (
    "a seeded nemesis (partitions, kills, pauses, slow links, a full store, clock jumps) vs a live workload; violations"
)
FAIL_ON_CHECKS = True  # `shoal bench chaos` exits 1 when the checker found a violation
KEYS = (API_KEY, "chaos-client-key-one-0123", "chaos-client-key-two-0123")
WORKERS = 3
STORE_BYTES = 512 << 20  # room for the telemetry stream's 256 MiB reservation; filled in about a second
STALL = float(FAST_SETTINGS["task_stall_seconds"])
SETTINGS = {
    "api_keys": ",".join([f"{API_KEY}:admin", *KEYS[1:]]),
    "events_max_bytes": "-1",
    "sse_keepalive_seconds": f"{KEEPALIVE_S:g}",  # what the clients' silence is counted in
}
TOPOLOGY = Topology(
    nats_hosts=("nats0", "nats1", "nats2"),
    service_hosts=("control", "m1", *(f"w{i}" for i in range(WORKERS))),
    processes=("nats0", "nats1", "nats2", "master0", "master1", "api", *(f"w{i}" for i in range(WORKERS))),
)
TICK = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the nemesis runs (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a random one, printed)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients sending the workload")
    parser.add_argument(
        "--kinds",
        default=",".join(FAULT_KINDS),
        help=f"fault kinds to schedule, comma-separated ({', '.join(FAULT_KINDS)})",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep the export, the records and the logs in DIR")
    parser.add_argument("--print-schedule", action="store_true", help="only print the schedule of --seed, run nothing")


def kinds_of(text: str) -> tuple[FaultKind, ...]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in FAULT_KINDS]
    if unknown or not names:
        raise SystemExit(
            f"shoal bench chaos: --kinds {text!r}: unknown {unknown}; choose from {', '.join(FAULT_KINDS)}"
        )
    return tuple(kind for kind in FAULT_KINDS if kind in names)


def run(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    minutes = 1.0 if args.quick and args.minutes == 10.0 else args.minutes
    schedule = make_schedule(seed, minutes * 60, TOPOLOGY, kinds_of(args.kinds))
    print("\n".join(schedule.lines()), file=sys.stderr)
    if args.print_schedule:
        return _result(schedule, None, quick=bool(args.quick), clients=args.clients)
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"shoal bench chaos: {reason}")
    report = run_chaos(schedule, clients=args.clients, keep=args.keep)
    if report.violations:
        print(f"shoal bench chaos: {len(report.violations)} violation(s), seed {seed}:", file=sys.stderr)
        print("\n".join(f"  {line}" for line in report.violations), file=sys.stderr)
        print("\n".join(schedule.lines()), file=sys.stderr)
        print(f"reproduce the schedule: shoal bench chaos --minutes {minutes:g} --seed {seed}", file=sys.stderr)
    return _result(schedule, report, quick=bool(args.quick), clients=args.clients)


@dataclass
class ChaosReport:
    calls: list[ClientRecord]
    windows: list[FaultWindow]
    recovery: Recovery
    violations: list[str]
    startup_seconds: float
    base_bound: float
    events: int
    failure_reasons: dict[str, int] = field(default_factory=dict)


def run_chaos(schedule: Schedule, *, clients: int, keep: Path | None = None) -> ChaosReport:
    """Run `schedule` against a fresh cluster and check the history."""
    with tempfile.TemporaryDirectory(prefix="shoal-chaos-") as tmp:
        root = Path(tmp)
        clocks = root / "clocks"
        clocks.mkdir()
        for host in TOPOLOGY.hosts:
            (clocks / host).write_text("0")
        booted = time.monotonic()
        cluster = NetCluster(
            root,
            workers=WORKERS,
            masters=2,
            settings=SETTINGS,
            host_env=clock_env(clocks, list(TOPOLOGY.service_hosts)),
            store_bytes=STORE_BYTES,
        )
        try:
            return _run(cluster, schedule, clients, booted, Nemesis(cluster, clocks, random.Random(schedule.seed)))
        finally:
            if keep is not None:
                _keep(root, keep)
            cluster.stop()


def _run(cluster: NetCluster, schedule: Schedule, count: int, booted: float, nemesis: Nemesis) -> ChaosReport:
    cluster.wait_ready(300)
    with _http(cluster, 0, 120) as http:  # the API's first request loads its tokenizer: not under chaos
        warm = send(http, RequestSpec(-1, 0, "stream", 3, 4), bound=120, clock=lambda: 0.0)
    if warm.outcome != "completed":
        raise SystemExit(f"shoal bench chaos: the first request ended {warm.outcome}: {warm.error}\n{cluster.tails()}")
    startup = time.monotonic() - booted
    base_bound = startup + 2 * STALL
    recovery_bound = 2 * startup + STALL
    bound = schedule.seconds + recovery_bound  # when a client gives up: a call this long is a hang, whatever held
    started = time.monotonic()

    def clock() -> float:
        return time.monotonic() - started

    clients = Clients(
        lambda key: _http(cluster, key, bound),
        workload(schedule.seed, len(KEYS)),
        count=count,
        bound=bound,
        clock=clock,
    )
    windows: list[FaultWindow] = []
    try:
        _follow(schedule, nemesis, clock, windows)
    finally:
        nemesis.heal_all_left()
        clients.stop_sending()
    last_heal = clock()
    recovery, probes = _recover(cluster, nemesis, clock, last_heal, recovery_bound)
    calls = [*clients.stop(), *probes]
    nemesis.check_exits()
    return _judge(cluster, nemesis, calls, windows, recovery, startup, base_bound)


def _follow(schedule: Schedule, nemesis: Nemesis, clock: Callable[[], float], windows: list[FaultWindow]) -> None:
    """Inject each step at its time (or as soon as the previous one healed), heal each fault after
    its duration, then wait out the schedule's length."""
    for step in schedule.steps:
        _wait_until(step.at, nemesis, clock)
        print(f"chaos t+{clock():.1f}s: " + " + ".join(f.describe() for f in step.faults), file=sys.stderr)
        held: list[Applied] = [nemesis.inject(fault, clock()) for fault in step.faults]
        for applied in sorted(held, key=lambda a: a.start + a.fault.seconds):
            _wait_until(applied.start + applied.fault.seconds, nemesis, clock)
            windows.append(nemesis.heal(applied, clock))
    _wait_until(schedule.seconds, nemesis, clock)


def _wait_until(at: float, nemesis: Nemesis, clock: Callable[[], float]) -> None:
    while clock() < at:
        nemesis.check_exits()
        time.sleep(min(TICK, max(0.0, at - clock())))


def _recover(
    cluster: NetCluster, nemesis: Nemesis, clock: Callable[[], float], last_heal: float, bound: float
) -> tuple[Recovery, list[ClientRecord]]:
    """Seconds after the last heal until every node is up at /healthz, and until a request is
    served; probing for up to twice the bound, so a late recovery is measured, not only flagged."""
    nodes_up: float | None = None
    served: float | None = None
    probes: list[ClientRecord] = []
    while clock() - last_heal < 2 * bound and (nodes_up is None or served is None):
        nemesis.check_exits()
        health = cluster.health()
        if nodes_up is None and health.get("nodes_up") == WORKERS:
            nodes_up = clock() - last_heal
        if served is None and int(health.get("ready_instances", 0) or 0) >= 1:  # pyright: ignore[reportArgumentType]
            with _http(cluster, 0, bound) as http:
                probe = send(http, RequestSpec(-2 - len(probes), 0, "stream", 3, 8), bound=bound, clock=clock)
            probes.append(probe)
            if probe.outcome == "completed":
                served = clock() - last_heal
        time.sleep(0.5)
    return Recovery(bound=bound, nodes_up_after=nodes_up, served_after=served), probes


def _judge(
    cluster: NetCluster,
    nemesis: Nemesis,
    calls: list[ClientRecord],
    windows: list[FaultWindow],
    recovery: Recovery,
    startup: float,
    bound: float,
) -> ChaosReport:
    """Read the log until every task on it ended (the last terminal events land after the clients
    stopped waiting), within the stall deadline and a margin; then judge."""
    deadline = time.monotonic() + 3 * STALL
    while True:
        records = asyncio.run(_read_log(cluster))
        history = fold_history(records)
        if all(task.ended for task in history.tasks.values()) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    diagnosed = _diagnosed(cluster.root, records)
    run = Run(
        history=history,
        calls=calls,
        faults=windows,
        recovery=recovery,
        workers=[worker.name for worker in cluster.workers],
        base_bound=bound,
        fault_grace=STALL,
        exits=nemesis.exits,
        diagnosed=diagnosed,
    )
    return ChaosReport(
        calls=calls,
        windows=windows,
        recovery=recovery,
        violations=violations(run),
        startup_seconds=startup,
        base_bound=bound,
        events=len(records),
        failure_reasons=_reasons(history),
    )


async def _read_log(cluster: NetCluster) -> list[tuple[int, LogEvent | None]]:
    """The whole events stream, in order; None for a message that is no event."""
    log = await EventLog.connect(cluster.admin_endpoint(), ensure=False, wait_seconds=10)
    try:
        return [(seq, event) async for seq, event in log.entries() if event is None or isinstance(event, LogEvent)]
    finally:
        await log.close()


def _diagnosed(root: Path, records: list[tuple[int, LogEvent | None]]) -> frozenset[str]:
    """The task ids `shoal diagnose` has a finding for, from the log exported as `shoal events export` writes it."""
    export = root / "export.jsonl"
    with export.open("wb") as out:
        write_export((ExportRecord(stream="events", seq=s, event=e) for s, e in records if e is not None), out)
    done = subprocess.run(
        shoal_argv("diagnose", "--file", str(export), "--json", "--history"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"shoal bench chaos: shoal diagnose failed ({done.returncode}): {done.stderr[-2000:]}")
    findings = json.loads(done.stdout).get("findings", [])
    return frozenset(f["task_id"] for f in findings if f.get("task_id"))


def _reasons(history: History) -> dict[str, int]:
    """Failed tasks by reason (the reason's first words: ids and numbers differ per task)."""
    counts = Counter(" ".join(t.reason.split()[:6]) for t in history.tasks.values() if t.ended == "failed")
    return dict(counts.most_common())


def _http(cluster: NetCluster, key: int, timeout: float) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.base_url,
        headers={"authorization": f"Bearer {KEYS[key]}"},
        timeout=timeout,
        transport=httpx.HTTPTransport(socket_options=TCP_KEEPALIVE),
    )


def _keep(root: Path, keep: Path) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for path in root.glob("*.err"):
        (keep / path.name).write_bytes(path.read_bytes()[-200_000:])
    if (root / "export.jsonl").exists():
        (keep / "export.jsonl").write_bytes((root / "export.jsonl").read_bytes())
    runner_logs = root / "data" / RUNNER_LOGS_DIRNAME  # each rank's stderr, by node (the checker names them)
    if runner_logs.is_dir():
        shutil.copytree(runner_logs, keep / RUNNER_LOGS_DIRNAME, dirs_exist_ok=True)


def _result(schedule: Schedule, report: ChaosReport | None, *, quick: bool, clients: int) -> dict[str, Any]:
    settings = {"minutes": schedule.seconds / 60, "seed": schedule.seed, "clients": clients}
    details: dict[str, Any] = {"schedule": schedule.lines(), "faults_by_kind": schedule.counts()}
    checks: dict[str, bool] = {}
    if report is not None:
        outcomes = Counter(call.outcome for call in report.calls)
        details |= {
            "requests_by_outcome": dict(outcomes),
            "requests_by_kind": dict(Counter(call.kind for call in report.calls)),
            "failed_tasks_by_reason": report.failure_reasons,
            "faults_applied": [f"{w.kind} {w.target} {w.detail} t+{w.start:.1f}..{w.end:.1f}s" for w in report.windows],
            "recovery": {
                "bound_s": round(report.recovery.bound, 1),
                "nodes_up_after_s": report.recovery.nodes_up_after,
                "served_after_s": report.recovery.served_after,
            },
            "startup_s": round(report.startup_seconds, 1),
            "call_bound_base_s": round(report.base_bound, 1),
            "events_on_log": report.events,
            "violations": report.violations,
        }
        checks = {"no violations": not report.violations, "requests were served": outcomes["completed"] > 0}
    return bench_result(
        "chaos",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures={},
        comparisons={},
        targets={},
        headline=[],
        checks=checks,
        details=details,
    )
