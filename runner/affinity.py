"""Where a rank's compute threads run: its Python thread and MLX's stream threads on one CPU.

On a CPU, MLX runs every op on its stream's thread while the Python thread builds the graph and
waits (`mx.eval`, and `mx.async_eval` once a few ops are queued): about 140 hand-offs between the
two threads per generated token of the tiny model. When the two sit on different CPUs, every
hand-off wakes the other CPU; a VM that halts an idle vCPU at once pays an exit to the hypervisor
for each. Measured on a 2-core VM (`cpuidle` haltpoll, `guest_halt_poll_ns=0`), one served stream
of the tiny model: 5.46 ms a token on any CPU, 4.24 on one.

The worker picks the CPU (`compute_cpu`: the first of the rank's share of the node, the same share
its BLAS threads are sized by) and hands it over in `SHOAL_COMPUTE_CPU`; the runner pins its main
thread first thing (`pin_compute_threads`), so every thread started after it inherits the CPU
(MLX starts its stream threads on first use). OpenBLAS starts its worker threads when the library
loads, before that, so they keep every CPU and a large matmul still spreads over the rank's share.
A helper thread that works off the step loop (a grammar compiling, a long prompt tokenizing) leaves
the compute CPU (`leave_compute_cpu`). Only where the OS has thread affinity (Linux; `can_pin`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Annotated

import msgspec

COMPUTE_CPU_ENV = "SHOAL_COMPUTE_CPU"
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


def compute_cpu(index: int, ranks_on_node: int, allowed: Sequence[int]) -> int:
    """The CPU of the node's `index`-th rank (in the node's order of its ranks): the first of its
    equal share of `allowed`; ranks beyond the CPUs wrap around."""
    if not allowed:
        raise ValueError("no CPU is allowed")
    cpus = sorted(allowed)
    share = max(1, len(cpus) // max(1, ranks_on_node))
    return cpus[(index * share) % len(cpus)]


def compute_cpu_env(index: int, ranks_on_node: int) -> dict[str, str]:
    """What a rank's process gets to pin its compute threads (`SHOAL_COMPUTE_CPU`): the node's
    `index`-th rank's CPU among those this process may use; nothing where the OS cannot pin."""
    if not can_pin():
        return {}
    return {COMPUTE_CPU_ENV: str(compute_cpu(index, ranks_on_node, sorted(STARTING_CPUS)))}


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
