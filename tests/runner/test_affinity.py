"""A rank's compute threads on one CPU (runner.affinity): which CPU, the pin, and that the threads
started after it, MLX's stream thread among them, inherit it, while OpenBLAS's workers and the
helper threads that work off the step loop keep every CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.affinity import (
    COMPUTE_CPU_ENV,
    PINNED_MARGIN,
    STARTING_CPUS,
    compute_cpu,
    compute_cpu_env,
    least_pinned_cpu,
    leave_compute_cpu,
    pin_compute_threads,
    pinned_elsewhere,
)
from runner.blas import SYSTEM_OPENBLAS_PATHS


@pytest.mark.parametrize(
    ("index", "ranks", "allowed", "cpu"),
    [
        (0, 1, [0, 1], 0),  # one rank: the first CPU, its BLAS worker free on the other
        (1, 2, [0, 1], 1),  # two ranks on two CPUs: one each
        (2, 3, [0, 1], 0),  # more ranks than CPUs: wrap around
        (1, 2, [5, 2, 4, 3], 4),  # a share of two CPUs each, from the sorted allowed set
        (0, 1, [7], 7),
    ],
)
def test_the_cpu_is_the_first_of_the_ranks_share(index: int, ranks: int, allowed: list[int], cpu: int) -> None:
    assert compute_cpu(index, ranks, allowed) == cpu


@pytest.mark.parametrize(
    ("index", "ranks", "allowed", "first", "cpu"),
    [
        (0, 1, [0, 1], 1, 1),  # another cluster's ranks hold CPU 0: this one's start on CPU 1
        (1, 2, [0, 1], 1, 0),  # two ranks still one CPU each, counted from CPU 1
        (1, 2, [5, 2, 4, 3], 4, 2),  # shares of two, counted from CPU 4 around the sorted CPUs
        (0, 1, [0, 1], 7, 0),  # a CPU not allowed: counted from the lowest, as without one
    ],
)
def test_the_shares_are_counted_from_the_first_cpu(
    index: int, ranks: int, allowed: list[int], first: int, cpu: int
) -> None:
    assert compute_cpu(index, ranks, allowed, first) == cpu


def test_the_least_pinned_cpu_is_the_one_fewest_other_threads_are_pinned_to() -> None:
    assert least_pinned_cpu({0, 1}, {0: 12, 1: 3}) == 1  # another cluster's rank holds CPU 0
    assert least_pinned_cpu({0, 1, 2}, {0: 12, 1: 7, 2: 1}) == 2
    assert least_pinned_cpu({0, 1, 2}, {0: 2, 1: 2, 2: 2}) == 0  # tied: the lowest
    assert least_pinned_cpu({0, 1}, {0: 13, 1: 13 - PINNED_MARGIN}) == 0  # a near tie too
    assert least_pinned_cpu({2, 3}, {0: 9}) == 2  # none pinned to the allowed ones


def test_pinned_threads_are_counted_per_cpu_leaving_out_this_clusters_and_the_kernels(tmp_path: Path) -> None:
    def process(pid: int, cmdline: bytes, *allowed: str) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(cmdline)
        for tid, cpus in enumerate(allowed):
            task = tmp_path / str(pid) / "task" / str(pid + tid)
            task.mkdir(parents=True)
            task.joinpath("status").write_text(f"Name:\tx\nCpus_allowed:\t3\nCpus_allowed_list:\t{cpus}\n")

    process(10, b"python\0-m\0runner.service.main\0--nats-url\0nats://127.0.0.1:4001\0", "0", "0", "0-1")
    process(20, b"python\0-m\0runner.service.main\0--nats-url\0nats://127.0.0.1:4002\0", "1", "0-1")
    process(30, b"", "0")  # a kernel thread: every CPU has its own
    process(40, b"python\0-m\0runner.service.main\0--nats-url\0nats://127.0.0.1:40020\0", "1")
    # its own runner left out; another cluster's whose URL it only begins is counted
    assert pinned_elsewhere("nats://127.0.0.1:4002", proc=tmp_path) == {0: 2, 1: 1}
    assert pinned_elsewhere("nats://127.0.0.1:9999", proc=tmp_path) == {0: 2, 1: 2}


def test_no_allowed_cpu_is_an_error() -> None:
    with pytest.raises(ValueError, match="no CPU"):
        compute_cpu(0, 1, [])


@pytest.mark.parametrize(
    ("value", "why"), [("", "not set"), ("two", "not a CPU number"), ("-1", "not a CPU number"), ("9", "not among")]
)
def test_what_cannot_be_pinned_is_left_to_the_os(value: str, why: str) -> None:
    pinned: list[set[int]] = []
    cpu, reason = pin_compute_threads({COMPUTE_CPU_ENV: value}, allowed=lambda: {0, 1}, pin=pinned.append)
    assert cpu is None and why in reason and pinned == []


def test_an_allowed_cpu_is_pinned() -> None:
    pinned: list[set[int]] = []
    assert pin_compute_threads({COMPUTE_CPU_ENV: " 1 "}, allowed=lambda: {0, 1}, pin=pinned.append)[0] == 1
    assert pinned == [{1}]


def test_a_helper_thread_leaves_for_the_cpus_the_process_started_with() -> None:
    pinned: list[frozenset[int]] = []
    leave_compute_cpu(pin=pinned.append)
    assert pinned == [STARTING_CPUS] and frozenset(os.sched_getaffinity(0)) == STARTING_CPUS


PROBE = """
import json, os, sys, threading
from runner.affinity import pin_compute_threads
before = set(os.listdir("/proc/self/task"))
cpu, _ = pin_compute_threads(os.environ)
import mlx.core as mx
mx.eval(mx.ones((64, 64)) @ mx.ones((64, 64)))  # MLX starts its stream thread on first use
helper = threading.Thread(target=lambda: None)
helper.start(); helper.join()
def cpus(tid):  # None: the thread ended between the listing and the read (the joined helper)
    try: return sorted(os.sched_getaffinity(int(tid)))
    except ProcessLookupError: return None
after = set(os.listdir("/proc/self/task"))
from runner.serial_worker import SerialWorker
off_loop = SerialWorker("probe").submit(lambda: sorted(os.sched_getaffinity(0))).result(timeout=20)
print(json.dumps({"cpu": cpu, "main": cpus(os.getpid()), "started_after": [c for t in after - before if (c := cpus(t)) is not None],
                  "started_before": [c for t in before if int(t) != os.getpid() and (c := cpus(t)) is not None], "off_loop": off_loop}))
"""


@pytest.mark.timeout(60)
def test_threads_started_after_the_pin_inherit_it_and_blas_workers_and_helpers_keep_every_cpu() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    cpu = allowed[-1]
    env = {**os.environ, COMPUTE_CPU_ENV: str(cpu), "OPENBLAS_NUM_THREADS": str(max(2, len(allowed)))}
    openblas = next((path for path in SYSTEM_OPENBLAS_PATHS if os.path.exists(path)), None)
    if openblas is not None:
        env["LD_PRELOAD"] = openblas  # as a runner gets it: its worker threads start when it loads
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["cpu"] == cpu and seen["main"] == [cpu]
    assert seen["started_after"], "MLX's stream thread started after the pin"
    assert all(cpus == [cpu] for cpus in seen["started_after"])
    assert seen["off_loop"] == allowed, "a helper thread off the step loop leaves the compute CPU"
    if openblas is not None:
        assert seen["started_before"], "OpenBLAS starts its worker threads when it loads"
        assert all(cpus == allowed for cpus in seen["started_before"])


def test_a_ranks_environment_names_the_first_cpu_of_its_share() -> None:
    cpus = sorted(STARTING_CPUS)
    assert compute_cpu_env(0, 1) == {COMPUTE_CPU_ENV: str(cpus[0])}
    assert compute_cpu_env(1, len(cpus)) == {COMPUTE_CPU_ENV: str(cpus[1 % len(cpus)])}
