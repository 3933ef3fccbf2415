"""The nemesis's plan (pure): a seeded random schedule of faults and the workload's requests,
generated whole from the seed before anything runs, so a failing run's seed reproduces it.

A schedule is a list of steps; each step injects one or two faults at once (on different
targets), holds them for their durations, heals every one, and a quiet gap follows before the
next step. The last step heals before the chaos ends, so the run ends with everything healed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal[
    "partition",  # one host's cable pulled: it reaches nothing, nothing reaches it
    "partition_majority",  # two of the three NATS hosts cut off: the log loses its quorum
    "partition_deaf",  # asymmetric: the host sends, but nothing reaches it
    "partition_mute",  # asymmetric: the host receives, but nothing it sends leaves it
    "kill",  # SIGKILL a process (NATS server, master, API, worker, rank); healed by starting it again
    "pause",  # SIGSTOP a process; healed by SIGCONT
    "shape",  # a narrow, slow wire (tbf) on one host's link
    "disk_full",  # a NATS server's store (a small tmpfs) filled up; healed by freeing it
    "clock_jump",  # a host's wall clock jumped forward or back by minutes; healed by setting it right
]
FAULT_KINDS: tuple[FaultKind, ...] = (
    "partition",
    "partition_majority",
    "partition_deaf",
    "partition_mute",
    "kill",
    "pause",
    "shape",
    "disk_full",
    "clock_jump",
)
RANK = "rank"  # a process target meaning "one runner process on a worker host", chosen when it fires
SHAPES = ("tbf rate 8mbit burst 32kbit latency 400ms", "tbf rate 1mbit burst 16kbit latency 800ms")


@dataclass(frozen=True)
class Topology:
    """What the faults can hit: host names by role, and the processes that run on them."""

    nats_hosts: tuple[str, ...]  # nats0.. (the processes of the same names live on them)
    service_hosts: tuple[str, ...]  # hosts of Python services: control, m1, w0.. (clock faults apply there)
    processes: tuple[str, ...]  # nats0.., master0.., api, w0.. (the worker processes); RANK for a runner

    @property
    def hosts(self) -> tuple[str, ...]:
        return (*self.nats_hosts, *self.service_hosts)


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    target: str  # a host (partitions, shape, clock_jump), a process (kill, pause) or a NATS server (disk_full)
    seconds: float  # how long it holds before it heals
    detail: str = ""  # the qdisc of a shape, the clock offset ("+300s") of a clock jump, the 2nd host of a majority

    def describe(self) -> str:
        extra = f" {self.detail}" if self.detail else ""
        return f"{self.kind} {self.target}{extra} for {self.seconds:.0f}s"


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the chaos starts (not before; a slow heal shifts later steps)
    faults: tuple[Fault, ...]

    @property
    def seconds(self) -> float:
        return max(fault.seconds for fault in self.faults)


@dataclass(frozen=True)
class Schedule:
    seed: int
    seconds: float  # the chaos's length; every step heals before it
    steps: tuple[Step, ...]

    def lines(self) -> list[str]:
        head = f"chaos schedule: seed {self.seed}, {self.seconds:.0f}s, {len(self.steps)} steps"
        return [head, *(f"  t+{s.at:6.1f}s  " + " + ".join(f.describe() for f in s.faults) for s in self.steps)]

    def counts(self) -> dict[str, int]:
        """Faults per kind."""
        counts: dict[str, int] = dict.fromkeys(FAULT_KINDS, 0)
        for step in self.steps:
            for fault in step.faults:
                counts[fault.kind] += 1
        return counts

    @property
    def longest_fault(self) -> float:
        return max((step.seconds for step in self.steps), default=0.0)


@dataclass(frozen=True)
class Pacing:
    """How long faults hold and how quiet the gaps between steps are (seconds)."""

    fault: tuple[float, float] = (3.0, 20.0)
    gap: tuple[float, float] = (4.0, 12.0)
    clock_offset: tuple[float, float] = (60.0, 600.0)  # a clock jump's size, either way
    two_at_once: float = 0.35  # the chance a step injects two faults


def make_schedule(
    seed: int, seconds: float, topology: Topology, kinds: Sequence[FaultKind] = FAULT_KINDS, pacing: Pacing = Pacing()
) -> Schedule:
    """The schedule of `seed`: the same arguments give the same schedule, always."""
    if not kinds:
        raise ValueError("no fault kinds to schedule")
    rng = random.Random(seed)
    steps: list[Step] = []
    at = rng.uniform(*pacing.gap)
    while True:
        faults = _step_faults(rng, topology, kinds, pacing)
        length = max(fault.seconds for fault in faults)
        if at + length > seconds:
            break
        steps.append(Step(at=round(at, 1), faults=faults))
        at += length + rng.uniform(*pacing.gap)
    return Schedule(seed=seed, seconds=seconds, steps=tuple(steps))


def _step_faults(
    rng: random.Random, topology: Topology, kinds: Sequence[FaultKind], pacing: Pacing
) -> tuple[Fault, ...]:
    first = _fault(rng, topology, rng.choice(kinds), pacing)
    if rng.random() >= pacing.two_at_once:
        return (first,)
    for _ in range(10):  # a second fault on other hosts and processes than the first's
        second = _fault(rng, topology, rng.choice(kinds), pacing)
        if not (_touches(first) & _touches(second)):
            return (first, second)
    return (first,)


def _touches(fault: Fault) -> set[str]:
    """The names a fault holds (a second fault at once must hold none of them)."""
    names = {fault.target}
    if fault.kind == "partition_majority":
        names.add(fault.detail)
    if fault.kind == "disk_full":
        names.add(f"store:{fault.target}")
    return names


def _fault(rng: random.Random, topology: Topology, kind: FaultKind, pacing: Pacing) -> Fault:
    seconds = round(rng.uniform(*pacing.fault), 1)
    if kind in ("partition", "partition_deaf", "partition_mute"):
        return Fault(kind, rng.choice(topology.hosts), seconds)
    if kind == "partition_majority":
        first, second = rng.sample(topology.nats_hosts, 2)
        return Fault(kind, first, seconds, detail=second)
    if kind in ("kill", "pause"):
        return Fault(kind, rng.choice((*topology.processes, RANK)), seconds)
    if kind == "shape":
        return Fault(kind, rng.choice(topology.hosts), seconds, detail=rng.choice(SHAPES))
    if kind == "disk_full":
        return Fault(kind, rng.choice(topology.nats_hosts), seconds)
    offset = rng.uniform(*pacing.clock_offset) * rng.choice((-1, 1))
    return Fault(kind, rng.choice(topology.service_hosts), seconds, detail=f"{offset:+.0f}s")


# --- the workload --------------------------------------------------------------------------

RequestKind = Literal["stream", "plain", "cancel", "structured"]
REQUEST_KINDS: tuple[RequestKind, ...] = ("stream", "plain", "cancel", "structured")


@dataclass(frozen=True)
class RequestSpec:
    number: int
    key: int  # which API key sends it
    kind: RequestKind
    prompt_words: int  # short (a sentence) or long (hundreds of tokens: many prefill steps)
    max_tokens: int
    cancel_after_chars: int = 0  # a "cancel" request closes its stream after this much text


def workload(seed: int, keys: int) -> Iterator[RequestSpec]:
    """The workload of `seed`, endless: the clients take the next one when they are free (which
    client sends which depends on timing; the sequence does not)."""
    rng = random.Random(seed ^ 0x5EED)
    number = 0
    while True:
        kind = rng.choice(REQUEST_KINDS)
        long = rng.random() < 0.3
        yield RequestSpec(
            number=number,
            key=rng.randrange(keys),
            kind=kind,
            prompt_words=rng.randint(120, 200) if long else rng.randint(3, 12),
            max_tokens=rng.randint(8, 48),
            cancel_after_chars=rng.randint(1, 12) if kind == "cancel" else 0,
        )
        number += 1
