"""Where a rank's compute threads run: its Python thread and MLX's stream threads on one CPU.

On a CPU, MLX runs every op on its stream's thread while the Python thread builds the graph and
waits (`mx.eval`, and `mx.async_eval` once a few ops are queued): about 140 hand-offs between the
two threads per generated token of the tiny model. When the two sit on different CPUs, every
hand-off wakes the other CPU; a VM that halts an idle vCPU at once pays an exit to the hypervisor
for each. Measured on a 2-core VM (`cpuidle` haltpoll, `guest_halt_poll_ns=0`), one served stream
of the tiny model: 5.46 ms a token on any CPU, 4.24 on one.

The worker picks the CPU (`compute_cpu`: the first of the rank's share of the node, the same share
its BLAS threads are sized by, counting from the CPU the fewest other programs' threads are pinned
to: `pinned_elsewhere`) and hands it over in `SHOAL_COMPUTE_CPU`; the runner pins its main
thread first thing (`pin_compute_threads`), so every thread started after it inherits the CPU
(MLX starts its stream threads on first use). OpenBLAS starts its worker threads when the library
loads, before that, so they keep every CPU and a large matmul still spreads over the rank's share.
A helper thread that works off the step loop (a grammar compiling, a long prompt tokenizing) leaves
the compute CPU (`leave_compute_cpu`). Only where the OS has thread affinity (Linux; `can_pin`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated

import msgspec

COMPUTE_CPU_ENV = "SHOAL_COMPUTE_CPU"
# Threads pinned elsewhere that make the lowest CPU give way (`least_pinned_cpu`): fewer than one
# rank's (its Python thread, MLX's stream thread, its log bridge and flight recorder, ...).
PINNED_MARGIN = 4
# The CPUs the process could run on when it loaded this module: a runner loads it before it pins.
STARTING_CPUS: frozenset[int] = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
PinRunnerThreads = Annotated[
    bool,
    msgspec.Meta(
        extra={"allowed": "true or false"},
        description="each runner's Python thread and MLX's compute threads share one CPU of its share of the node",
    ),
]


def can_pin() -> bool:
    return hasattr(os, "sched_setaffinity") and bool(STARTING_CPUS)


def compute_cpu(index: int, ranks_on_node: int, allowed: Sequence[int], first: int | None = None) -> int:
    """The CPU of the node's `index`-th rank (in the node's order of its ranks): the first of its
    equal share of `allowed`, counted from `first` (default: the lowest) around the sorted CPUs;
    ranks beyond the CPUs wrap around."""
    if not allowed:
        raise ValueError("no CPU is allowed")
    cpus = sorted(allowed)
    if first is not None and first in cpus:
        start = cpus.index(first)
        cpus = cpus[start:] + cpus[:start]
    share = max(1, len(cpus) // max(1, ranks_on_node))
    return cpus[(index * share) % len(cpus)]


def compute_cpu_env(index: int, ranks_on_node: int, first: int | None = None) -> dict[str, str]:
    """What a rank's process gets to pin its compute threads (`SHOAL_COMPUTE_CPU`): the node's
    `index`-th rank's CPU among those this process may use, counted from `first`; nothing where
    the OS cannot pin."""
    if not can_pin():
        return {}
    return {COMPUTE_CPU_ENV: str(compute_cpu(index, ranks_on_node, sorted(STARTING_CPUS), first))}


def least_pinned_cpu(allowed: Collection[int], pinned: Mapping[int, int]) -> int:
    """The CPU of `allowed` that the fewest threads of other programs are pinned to (`pinned`: how
    many on each, from `pinned_elsewhere`), when it has `PINNED_MARGIN` fewer than the lowest CPU;
    else the lowest. Every worker of a cluster on the host reads the counts at its own moment, and
    another program starting its threads meanwhile must not make them choose apart (their ranks
    would share a CPU): a near tie keeps the lowest, as before the counts were read."""
    if not allowed:
        raise ValueError("no CPU is allowed")
    cpus = sorted(allowed)
    least = min(cpus, key=lambda cpu: pinned.get(cpu, 0))
    return least if pinned.get(least, 0) + PINNED_MARGIN < pinned.get(cpus[0], 0) else cpus[0]


def pinned_elsewhere(ours: str, proc: Path = Path("/proc")) -> dict[int, int]:
    """How many threads of user processes are pinned to each single CPU, leaving out the processes
    with `ours` among their arguments (this cluster's runners: its NATS URL) and kernel threads
    (every CPU has its own). Another cluster on this machine pins its ranks' compute threads too:
    counted from the lowest CPU, two clusters stacked theirs on CPU 0 while CPU 1 had room, and a
    thread pinned beside another program's busy compute threads went seconds without running
    (measured here: 2-4 s, against none on the other CPU)."""
    counts: dict[int, int] = {}
    for process in proc.glob("[0-9]*"):
        try:
            cmdline = (process / "cmdline").read_bytes()
            if not cmdline or ours.encode() in cmdline.split(b"\0"):  # an argument, not a prefix of one
                continue
            for task in (process / "task").iterdir():
                cpu = _single_cpu(task / "status")
                if cpu is not None:
                    counts[cpu] = counts.get(cpu, 0) + 1
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return counts


def _single_cpu(status: Path) -> int | None:
    """The one CPU a thread may run on (its `Cpus_allowed_list`), or None when it may use several."""
    for line in status.read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            value = line.split(":", 1)[1].strip()
            return int(value) if value.isdigit() else None
    return None


def pin_compute_threads(
    env: Mapping[str, str],
    allowed: Callable[[], Collection[int]] = lambda: os.sched_getaffinity(0),
    pin: Callable[[set[int]], None] = lambda cpus: os.sched_setaffinity(0, cpus),
) -> tuple[int | None, str]:
    """Pin the calling thread to `SHOAL_COMPUTE_CPU` (call it on the main thread before any other
    thread starts and before MLX's first evaluation). Returns the CPU, or None and why not: unset,
    not a CPU number, or a CPU this process may not run on."""
    value = env.get(COMPUTE_CPU_ENV, "").strip()
    if not value:
        return None, f"{COMPUTE_CPU_ENV} is not set: the OS places the threads"
    if not can_pin():
        return None, "this OS has no thread affinity: it places the threads"
    if not value.isdigit():
        return None, f"{COMPUTE_CPU_ENV}={value!r} is not a CPU number: the OS places the threads"
    cpu = int(value)
    if cpu not in allowed():
        return None, f"{COMPUTE_CPU_ENV}={cpu} is not among this process's CPUs: the OS places the threads"
    pin({cpu})
    return cpu, f"compute threads on CPU {cpu}"


def leave_compute_cpu(pin: Callable[[frozenset[int]], None] | None = None) -> None:
    """Let the calling thread run on every CPU the process started with (a helper thread started
    after the pin inherited the compute CPU); nothing where the OS has no thread affinity."""
    if pin is None and not can_pin():
        return
    (pin or (lambda cpus: os.sched_setaffinity(0, cpus)))(STARTING_CPUS)
