"""Spawn a local ring group of N rank processes, collect their results, never hang (no MLX here).

Each rank is `python -m runner.local.rank_main` with MLX_RANK / MLX_HOSTFILE set, the BLAS env from
`runner.blas`, and its output in a temp dir that is removed afterwards. The launcher polls the
processes: a rank that exits non-zero (or is killed) fails the run at once with its number;
past the deadline the run fails naming the rank whose phase has been stuck the longest.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.affinity import compute_cpu_env
from runner.blas import blas_env
from runner.errors import RankFailedError

POLL_S = 0.05
# Each rank rewrites its phase file every 0.2 s from a thread that runs even while MLX blocks;
# a file this old means the whole process is frozen (stopped, swapping, wedged in C code).
HEARTBEAT_STALE_S = 10.0
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


@dataclass(slots=True)
class RankProcess:
    rank: int
    process: subprocess.Popen[bytes]
    stderr_path: Path


def rank_env(rank: int, world: int, hostfile: Path, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(blas_env(base.get("SHOAL_BLAS"), world, os.cpu_count() or 1, base))
    for name, value in compute_cpu_env(rank, world).items():  # as a worker places its runners
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
        for rank in range(world):
            ranks.append(_spawn(rank, world, job_path, workdir, hostfile, base))
        _wait(ranks, workdir, time.monotonic() + deadline_s)
        return [_read_result(workdir, rp) for rp in ranks]
    finally:
        for rp in ranks:
            _kill(rp.process)
        shutil.rmtree(workdir, ignore_errors=True)


def _spawn(rank: int, world: int, job: Path, workdir: Path, hostfile: Path, base: dict[str, str]) -> RankProcess:
    stderr_path = workdir / f"rank{rank}.stderr"
    with open(stderr_path, "wb") as stderr, open(workdir / f"rank{rank}.stdout", "wb") as stdout:
        process = subprocess.Popen(
            [sys.executable, "-m", "runner.local.rank_main", str(job), str(workdir)],
            env=rank_env(rank, world, hostfile, base),
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the CLI is handled here, not raced by ranks
        )
    return RankProcess(rank, process, stderr_path)


def _wait(ranks: list[RankProcess], workdir: Path, deadline: float) -> None:
    while True:
        codes = [rp.process.poll() for rp in ranks]
        failed = [(rp, code) for rp, code in zip(ranks, codes, strict=True) if code is not None and code != 0]
        if failed:  # one killed by a signal first: the others that exited meanwhile had lost it as a peer
            rp, code = min(failed, key=lambda failure: failure[1] >= 0)
            raise RankFailedError(rp.rank, _death_message(rp, code, workdir))
        if all(code == 0 for code in codes):
            return
        for rp, code in zip(ranks, codes, strict=True):
            age = _heartbeat_age(workdir, rp.rank)
            if code is None and age is not None and age > HEARTBEAT_STALE_S:
                raise RankFailedError(rp.rank, _frozen_message(rp.rank, age, workdir))
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


def _heartbeat_age(workdir: Path, rank: int) -> float | None:
    try:
        return time.time() - (workdir / f"rank{rank}.phase").stat().st_mtime
    except OSError:
        return None  # not started yet: the deadline covers a rank that never starts


def _frozen_message(rank: int, age: float, workdir: Path) -> str:
    phase = _load(workdir / f"rank{rank}.phase") or {}
    return (
        f"rank {rank} stopped responding: no heartbeat for {age:.1f}s, last in phase {phase.get('phase')} "
        f"(task {phase.get('task_id')}, iteration {phase.get('iteration')})"
    )


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
