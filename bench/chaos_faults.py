"""The nemesis's hands: each fault of a schedule (`bench/chaos_schedule.py`) injected into a
`NetCluster` and healed, with the window it held for (`FaultWindow`), and the services that
exited while no fault had stopped them (the checker's `exits`).

Heals do what the fault's opposite is on a real cluster: a killed process is started again (as
an operator or its supervisor would), a paused one continued, a cable plugged back, a shaped link
cleared, a wall clock set right, a full disk freed (and its NATS server restarted once it had
failed to write, as `shoal up`'s keeper does, `services/nats_keeper.py`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos_check import FaultWindow
from bench.chaos_schedule import RANK, Fault
from bench.hosts import Host
from bench.netcluster import NetCluster
from services.nats_durability import OutOfSpaceWatch

CLOCK_FILE_ENV = "SHOAL_CHAOS_CLOCK_FILE"
CLOCK_MODULE_DIR = Path(__file__).parent / "chaos_clock"  # its sitecustomize reads the file
MIB = 1 << 20
API_START_SECONDS = 120.0  # the longest a heal waits for a restarted API to answer


def clock_env(clock_dir: Path, hosts: list[str]) -> dict[str, dict[str, str]]:
    """The environment that gives each host's Python processes a wall clock the nemesis can jump."""
    path = os.pathsep.join(p for p in (str(CLOCK_MODULE_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {host: {CLOCK_FILE_ENV: str(clock_dir / host), "PYTHONPATH": path} for host in hosts}


@dataclass
class Applied:
    """A fault while it holds: what to undo."""

    fault: Fault
    start: float
    pid: int = 0  # the process a kill or pause hit
    process: str = ""  # its name in the cluster (empty for a rank)
    note: str = ""  # what actually happened, when it differs from the plan (no runner to hit, ...)
    watch: OutOfSpaceWatch | None = None


@dataclass
class Nemesis:
    cluster: NetCluster
    clock_dir: Path
    rng: random.Random  # picks which runner a "rank" fault hits (seeded: the same seed, the same picks)
    exits: list[str] = field(default_factory=list)
    _held: set[str] = field(default_factory=set)  # processes a fault holds down: their exit is expected
    _seen_exited: set[int] = field(default_factory=set)

    def inject(self, fault: Fault, now: float) -> Applied:
        applied = Applied(fault, now)
        net = self.cluster.net
        if fault.kind == "partition":
            net.partition(fault.target)
        elif fault.kind == "partition_majority":
            net.partition(fault.target)
            net.partition(fault.detail)
        elif fault.kind == "partition_deaf":
            net.deafen(fault.target)
        elif fault.kind == "partition_mute":
            net.mute(fault.target)
        elif fault.kind == "shape":
            net.shape(fault.target, *fault.detail.split())
        elif fault.kind == "clock_jump":
            _write_offset(self.clock_dir / fault.target, fault.detail.removesuffix("s"))
        elif fault.kind == "disk_full":
            self._fill(applied)
        else:
            self._signal(applied, signal.SIGKILL if fault.kind == "kill" else signal.SIGSTOP)
        return applied

    def heal(self, applied: Applied, clock: Callable[[], float]) -> FaultWindow:
        """Undo `applied`; its window ends when the heal is done (`clock()` then: a restarted API
        answering again), so what the heal itself took counts as the fault's."""
        fault, net = applied.fault, self.cluster.net
        if fault.kind == "partition":
            net.heal(fault.target)
        elif fault.kind == "partition_majority":
            net.heal(fault.target)
            net.heal(fault.detail)
        elif fault.kind in ("partition_deaf", "shape"):
            net.unshape(fault.target)
        elif fault.kind == "partition_mute":
            net.unmute(fault.target)
        elif fault.kind == "clock_jump":
            _write_offset(self.clock_dir / fault.target, "0")
        elif fault.kind == "disk_full":
            self._free(applied)
        elif fault.kind == "pause" and applied.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(applied.pid, signal.SIGCONT)
        elif fault.kind == "kill" and applied.process:
            self._restart(applied.process)
        self._held.discard(applied.process)
        detail = " ".join(p for p in (fault.detail, applied.note) if p)
        return FaultWindow(fault.kind, fault.target, applied.start, clock(), detail)

    # --- processes -------------------------------------------------------------------------

    def _signal(self, applied: Applied, sig: signal.Signals) -> None:
        target = applied.fault.target
        if target == RANK:
            runners = sorted(pid for worker in self.cluster.workers for pid in _runner_pids(self.cluster, worker))
            if not runners:
                applied.note = "(no runner was running)"
                return
            applied.pid = self.rng.choice(runners)
            applied.note = f"(runner pid {applied.pid})"
        else:
            proc = self.cluster.procs[target]
            if proc.process.poll() is not None:
                applied.note = "(it had already exited)"
                return
            applied.pid, applied.process = proc.process.pid, target
            self._held.add(target)
        with contextlib.suppress(ProcessLookupError):
            os.kill(applied.pid, sig)

    def _restart(self, name: str) -> None:
        cluster = self.cluster
        old = cluster.procs[name].process
        with contextlib.suppress(Exception):
            old.wait(10)
        self._seen_exited.add(old.pid)
        if name.startswith("nats"):
            cluster.start_nats(int(name.removeprefix("nats")))
        elif name.startswith("master"):
            cluster.start_master(int(name.removeprefix("master")))
        elif name == "api":
            cluster.start_service(cluster.control, "api", "api")
            _wait_listening(cluster)
        else:
            cluster.start_worker(cluster.net.hosts[name])

    def check_exits(self) -> None:
        """Record (and start again, so the run goes on) every service that exited while no fault held it down."""
        for name, proc in list(self.cluster.procs.items()):
            code = proc.process.poll()
            if code is None or name in self._held or proc.process.pid in self._seen_exited:
                continue
            self._seen_exited.add(proc.process.pid)
            self.exits.append(f"{name} (exit code {code}): {proc.tail(600)!r}")
            self._restart(name)

    # --- disk ------------------------------------------------------------------------------

    def _fill(self, applied: Applied) -> None:
        name = applied.fault.target
        proc = self.cluster.procs[name]
        applied.watch = OutOfSpaceWatch(proc.stderr_path)
        applied.watch.new_run()
        applied.process = name
        self._held.add(name)  # a server out of space may stop; the heal starts it again
        _fill(self.cluster.store_of(int(name.removeprefix("nats"))) / "chaos-filler")

    def _free(self, applied: Applied) -> None:
        name = applied.fault.target
        (self.cluster.store_of(int(name.removeprefix("nats"))) / "chaos-filler").unlink(missing_ok=True)
        proc = self.cluster.procs[name]
        stopped = proc.process.poll() is not None
        if stopped or (applied.watch is not None and applied.watch.full()):
            applied.note = "(its server had failed to write: restarted)"
            proc.stop(signal.SIGTERM, grace=10)
            self._seen_exited.add(proc.process.pid)
            self.cluster.start_nats(int(name.removeprefix("nats")))

    def heal_all_left(self) -> None:
        """The run's end, whatever happened: every cable in, every link clear, every clock right,
        every process continued, every filler gone."""
        for host in self.cluster.net.hosts:
            self.cluster.net.heal(host)
            self.cluster.net.unshape(host)
            self.cluster.net.unmute(host)
            _write_offset(self.clock_dir / host, "0")
        for proc in self.cluster.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.process.pid, signal.SIGCONT)
        for index in range(3):
            (self.cluster.store_of(index) / "chaos-filler").unlink(missing_ok=True)


def _wait_listening(cluster: NetCluster, timeout: float = API_START_SECONDS) -> None:
    """Until the restarted API answers /healthz (a start takes seconds): the heal of a killed API
    ends when it is back, so a client refused meanwhile is within the fault's window."""
    deadline = time.monotonic() + timeout
    while not cluster.health() and time.monotonic() < deadline:
        time.sleep(0.25)


def _runner_pids(cluster: NetCluster, host: Host) -> list[int]:
    found: list[int] = []
    for pid in cluster.net.pids(host):
        with contextlib.suppress(OSError):
            if b"runner.service.main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def _write_offset(path: Path, seconds: str) -> None:
    """Written whole then renamed: a reader never sees half an offset."""
    partial = path.with_suffix(".new")
    partial.write_text(seconds)
    partial.replace(path)


def _fill(path: Path) -> None:
    """Grow `path` until its filesystem is full: allocated at once (writing hundreds of MiB takes
    seconds on a loaded machine), then written until ENOSPC for whatever the allocation left.
    Unbuffered: a buffered file's close would try the failed write again and raise."""
    chunk = b"\0" * MIB
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            os.posix_fallocate(fd, 0, max(1, shutil.disk_usage(path.parent).free - MIB))
        os.lseek(fd, 0, os.SEEK_END)
        with contextlib.suppress(OSError):  # ENOSPC: full
            while os.write(fd, chunk):
                pass
    finally:
        os.close(fd)
