"""Spawn a local ring group of N rank processes, collect their results, never hang (no MLX here).

Each rank is `python -m runner.local.rank_main` with MLX_RANK / MLX_HOSTFILE set, the BLAS env from
`runner.blas`, and its output in a temp dir that is removed afterwards. The launcher polls the
processes: a rank that exits non-zero (or is killed) fails the run at once with its number; a
frozen rank (`is_frozen`) fails it once its heartbeat is `HEARTBEAT_STALE_S` old; past the
deadline the run fails naming the rank whose phase has been stuck the longest.

A silent heartbeat alone does not say a rank is frozen. The phase file is rewritten by a Python
thread (`runner.flight.recorder`), which needs the GIL for each beat, and a main thread inside a
long call that holds it (compiling a module without its .pyc, a C extension loading, a regex over
a big file) keeps it waiting; each beat takes the GIL several times (encode, open, write, rename),
so the wait repeats. A rank importing transformers on a fresh clone with both cores busy took 16-22 s
to reach `loading`, its beats up to 7 s apart. A frozen process (stopped, wedged in C code,
its memory swapped out) also uses no CPU: that is what tells the two apart.

Both silences are timed on the launcher's own monotonic clock, from the polls that saw them
(`Liveness`), never as the wall clock minus a file's mtime: a wall-clock step is no silence. And
the launcher counts only silence it was there to see: when its own polls stop for a while (the
machine or its VM stalled, the launcher starved), every rank stopped with it, and its first poll
afterwards would see stale heartbeats and CPU times that had no chance to move; so a gap in the
launcher's polls restarts the counts. A rank with a thread waiting on the disk (state D) is
waiting, not frozen, and one with a thread runnable (state R) is waiting for a CPU: the deadline
bounds both. A fresh clone's suite beside a chaos run (load 12 on 2 cores) had a lone rank's CPU
time stand still for 10 s with three threads runnable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.affinity import STARTING_CPUS, can_pin, compute_cpu_env, least_pinned_cpu, pinned_elsewhere
from runner.blas import blas_env
from runner.errors import RankFailedError

POLL_S = 0.05
# Each rank rewrites its phase file every 0.2 s from a thread that runs even while MLX blocks; a
# file this old, from a process that used no CPU for as long, means it is frozen (`is_frozen`).
HEARTBEAT_STALE_S = 10.0
# Polls this far apart mean the launcher itself was not running: it saw nothing meanwhile.
LAUNCHER_GAP_S = 1.0
STDERR_TAIL_CHARS = 1500


def free_ports(count: int) -> list[int]:
    """Ports the OS just handed out on 127.0.0.1 (closed again; the ranks bind them next)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def ring_hostfile(ports: list[int]) -> list[list[str]]:
    """mlx ring hostfile: one list of "ip:port" per rank (what `mlx.launch` writes)."""
    return [[f"127.0.0.1:{port}"] for port in ports]


def process_cpu_ticks(pid: int) -> int | None:
    """The CPU time process `pid` has used (every thread, user and system) in clock ticks; None
    where the OS has no /proc (macOS) or the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces or ")"
    return int(fields[11]) + int(fields[12])  # utime and stime: fields 14 and 15 of proc(5)


@dataclass(slots=True)
class Unchanged:
    """How long a reading has stood still, on the launcher's monotonic clock, as far as its polls saw."""

    value: object = None
    since: float = field(default_factory=time.monotonic)

    def seen(self, value: object, now: float) -> float:
        """Record `value` read at `now`; the seconds since a poll first saw the current value."""
        if value != self.value:
            self.value, self.since = value, now
        return now - self.since

    def restart(self, now: float) -> None:
        """The launcher was not looking: the stillness it did not see is no evidence."""
        self.since = now


@dataclass(slots=True)
class Liveness:
    """What the launcher saw of one rank: how long its heartbeat (the phase file's mtime) and its
    CPU time (every thread, `process_cpu_ticks`) have stood still."""

    pid: int
    phase_path: Path
    beat: Unchanged = field(default_factory=Unchanged)
    cpu: Unchanged = field(default_factory=Unchanged)

    def silent_for(self, now: float) -> float | None:
        """Seconds since a poll saw the heartbeat change; None before its first beat (the deadline
        covers a rank that never starts)."""
        try:
            written = self.phase_path.stat().st_mtime_ns
        except OSError:
            return None
        return self.beat.seen(written, now)

    def idle_for(self, now: float) -> float | None:
        """Seconds since a poll saw the process's CPU time grow; None where it cannot be read."""
        ticks = process_cpu_ticks(self.pid)
        if ticks is None:
            return None
        return self.cpu.seen(ticks, now)

    def overlook(self, now: float) -> None:
        self.beat.restart(now)
        self.cpu.restart(now)


def is_frozen(
    heartbeat_age: float | None, cpu_idle: float | None, bound: float = HEARTBEAT_STALE_S, phase: str | None = None
) -> bool:
    """A rank is frozen when its heartbeat is older than `bound` and its process used no CPU for as
    long: one that is busy holding the GIL is working, not frozen (the deadline bounds it). Where
    the CPU time cannot be read (`cpu_idle` None) the heartbeat decides alone; a rank with no
    heartbeat yet is judged by the deadline, and so is one still `loading`: it forms the ring in
    `mx.distributed.init`, which waits for the slowest peer to start without letting the heartbeat
    thread run and without using CPU (a peer still importing MLX on a loaded host takes tens of
    seconds)."""
    if heartbeat_age is None or heartbeat_age <= bound or phase == "loading":
        return False
    return cpu_idle is None or cpu_idle > bound


@dataclass(slots=True)
class RankProcess:
    rank: int
    process: subprocess.Popen[bytes]
    stderr_path: Path
    liveness: Liveness


def rank_env(
    rank: int, world: int, hostfile: Path, base: dict[str, str], first_cpu: int | None = None
) -> dict[str, str]:
    env = dict(base)
    env.update(blas_env(base.get("SHOAL_BLAS"), world, os.cpu_count() or 1, base))
    for name, value in compute_cpu_env(rank, world, first_cpu).items():  # as a worker places its runners
        env.setdefault(name, value)
    env["MLX_RANK"] = str(rank)
    env["MLX_HOSTFILE"] = str(hostfile)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_group(
    job: dict[str, Any], world: int, deadline_s: float, extra_env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run `job` on `world` local ranks; return each rank's result dict, in rank order."""
    workdir = Path(tempfile.mkdtemp(prefix="shoal-group-"))
    ranks: list[RankProcess] = []
    try:
        job_path = workdir / "job.json"
        job_path.write_text(json.dumps(job))
        hostfile = workdir / "hostfile.json"
        hostfile.write_text(json.dumps(ring_hostfile(free_ports(world))))
        base = {**os.environ, **(extra_env or {})}
        first_cpu = least_pinned_cpu(STARTING_CPUS, pinned_elsewhere(str(workdir))) if can_pin() else None
        for rank in range(world):
            ranks.append(_spawn(rank, world, job_path, workdir, hostfile, base, first_cpu))
        _wait(ranks, workdir, time.monotonic() + deadline_s)
        return [_read_result(workdir, rp) for rp in ranks]
    finally:
        for rp in ranks:
            _kill(rp.process)
        shutil.rmtree(workdir, ignore_errors=True)


def _spawn(
    rank: int, world: int, job: Path, workdir: Path, hostfile: Path, base: dict[str, str], first_cpu: int | None
) -> RankProcess:
    stderr_path = workdir / f"rank{rank}.stderr"
    with open(stderr_path, "wb") as stderr, open(workdir / f"rank{rank}.stdout", "wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "runner.local.rank_main", str(job), str(workdir)],
            env=rank_env(rank, world, hostfile, base, first_cpu),
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the CLI is handled here, not raced by ranks
        )
    return RankProcess(rank, process, stderr_path, Liveness(process.pid, workdir / f"rank{rank}.phase"))


def _wait(ranks: list[RankProcess], workdir: Path, deadline: float) -> None:
    polled = time.monotonic()
    while True:
        codes = [rp.process.poll() for rp in ranks]
        failed = [(rp, code) for rp, code in zip(ranks, codes, strict=True) if code is not None and code != 0]
        if failed:  # one killed by a signal first: the others that exited meanwhile had lost it as a peer
            rp, code = min(failed, key=lambda failure: failure[1] >= 0)
            raise RankFailedError(rp.rank, _death_message(rp, code, workdir))
        if all(code == 0 for code in codes):
            return
        now = time.monotonic()
        if now - polled > LAUNCHER_GAP_S:  # the launcher itself stood still (see the module's doc)
            for rp in ranks:
                rp.liveness.overlook(now)
        polled = now
        for rp, code in zip(ranks, codes, strict=True):
            if code is not None or (workdir / f"rank{rp.rank}.json").exists():
                continue  # exited, or its result is in and only its exit is left: the deadline's
            silent = rp.liveness.silent_for(now)
            phase = (_load(workdir / f"rank{rp.rank}.phase") or {}).get("phase") if silent is not None else None
            if is_frozen(silent, rp.liveness.idle_for(now), phase=phase) and not _waits_for_disk_or_cpu(rp.process.pid):
                raise RankFailedError(rp.rank, _frozen_message(rp.rank, silent or 0.0, workdir, ranks, now))
        if time.monotonic() > deadline:
            raise _stall_error([rp for rp, code in zip(ranks, codes, strict=True) if code is None], workdir)
        time.sleep(POLL_S)


def _death_message(rp: RankProcess, code: int, workdir: Path) -> str:
    reported = _load(workdir / f"rank{rp.rank}.json")
    if reported and "error" in reported:
        return f"rank {rp.rank} failed in phase {reported.get('phase')}: {reported['error']}"
    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    phase = _load(workdir / f"rank{rp.rank}.phase") or {}
    where = f" during {phase.get('phase')} (task {phase.get('task_id')}, iteration {phase.get('iteration')})"
    tail = rp.stderr_path.read_text(errors="replace")[-STDERR_TAIL_CHARS:].strip()
    return f"rank {rp.rank} {how}{where if phase else ''}" + (f"; stderr: {tail}" if tail else "")


def _frozen_message(rank: int, age: float, workdir: Path, ranks: list[RankProcess], now: float) -> str:
    phase = _load(workdir / f"rank{rank}.phase") or {}
    seen = "; ".join(_process_seen(rp, workdir, now) for rp in ranks)
    return (
        f"rank {rank} stopped responding: no heartbeat for {age:.1f}s, last in phase {phase.get('phase')} "
        f"(task {phase.get('task_id')}, iteration {phase.get('iteration')}); {seen}"
    )


def _process_seen(rp: RankProcess, workdir: Path, now: float) -> str:
    """What the launcher saw of a rank when it judged one frozen: enough to tell a stopped process
    from one waiting on the disk or on a peer (each thread's state and kernel wait channel)."""
    idle = rp.liveness.idle_for(now)
    result = "result written" if (workdir / f"rank{rp.rank}.json").exists() else "no result"
    return (
        f"rank {rp.rank} (pid {rp.process.pid}): cpu idle {'?' if idle is None else f'{idle:.1f}s'}, "
        f"{result}, threads {thread_states(rp.process.pid) or '?'}"
    )


def _waits_for_disk_or_cpu(pid: int) -> bool:
    """A thread of `pid` waits on the disk (D) or is runnable (R): held up, not frozen."""
    return any(state[:1] in ("D", "R") for state in (thread_states(pid) or "").split()[1::2])


def thread_states(pid: int) -> str | None:
    """The threads of `pid` by `state:wait channel` (proc(5): R running, S sleeping, D waiting on
    the disk, T stopped), counted, e.g. "12x S:futex_wait_queue 1x D:folio_wait_bit"; None without /proc."""
    states: Counter[str] = Counter()
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        with contextlib.suppress(OSError):
            base = Path(f"/proc/{pid}/task/{tid}")
            state = (base / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (base / "wchan").read_text().strip()
            states[f"{state}:{wchan}" if wchan not in ("", "0") else state] += 1
    return " ".join(f"{count}x {state}" for state, count in states.most_common())


def _stall_error(running: list[RankProcess], workdir: Path) -> RankFailedError:
    now = time.monotonic_ns()
    phases = {rp.rank: _load(workdir / f"rank{rp.rank}.phase") or {} for rp in running}
    # The rank whose phase is oldest is where the group stopped moving.
    stuck = min(running, key=lambda rp: phases[rp.rank].get("since_ns", 0))
    info = phases[stuck.rank]
    age = (now - info["since_ns"]) / 1e9 if "since_ns" in info else float("nan")
    others = ", ".join(f"rank {r}: {p.get('phase', '?')}" for r, p in sorted(phases.items()))
    return RankFailedError(
        stuck.rank,
        f"rank {stuck.rank} stalled in phase {info.get('phase', 'startup')} "
        f"(task {info.get('task_id')}, iteration {info.get('iteration')}) for {age:.1f}s; {others}",
    )


def _read_result(workdir: Path, rp: RankProcess) -> dict[str, Any]:
    result = _load(workdir / f"rank{rp.rank}.json")
    if result is None:
        raise RankFailedError(rp.rank, f"rank {rp.rank} exited without writing a result")
    return result


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
