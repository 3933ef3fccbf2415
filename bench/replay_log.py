"""The generated log `shoal bench replay` reads: a realistic export, about 1,000 records per task.

Tasks on 2-rank pipelines: GPipe prefill iterations, one ChunkGenerated per token at ~50
tokens/s, 1 Hz heartbeats per rank, a cancelled task every 50, a failed one every 97, and a
last task wedged in prefill (rank 1 stuck in compute), which `diagnose` must find.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import BinaryIO

from events.codec import ExportRecord, encode_record
from events.vocabulary import Phase
from services.ops.synthetic import COLLECTIVE_STACK, COMPUTE_STACK, LogBuilder, PrefillPlan, simulate_prefill


def _beat_all(log: LogBuilder, instance: str, task: str, phase: Phase, iteration: int, world: int) -> None:
    for rank in range(world):
        log.heartbeat(instance, rank, phase, task, iteration)


def _decode(log: LogBuilder, instance: str, task: str, tokens: int, world: int, cancel_at: int | None) -> int:
    """One ChunkGenerated per token at ~50 tokens/s, heartbeats every second; returns tokens made."""
    for index in range(tokens):
        log.advance(0.02)
        log.chunk(task, index, 1)  # from the sampling rank
        if index % 50 == 49:
            _beat_all(log, instance, task, "decode", 0, world)
        if cancel_at is not None and index == cancel_at:
            log.cancelled(task)
            log.advance(0.01)
            return index + 1
    return tokens


def _task(log: LogBuilder, rng: random.Random, number: int, instance: str, world: int) -> None:
    task = f"task_{number:06d}"
    log.task_created(task)
    log.task_assigned(task, instance)
    plan = PrefillPlan(task_id=task, instance_id=instance, world=world, chunks=rng.randint(8, 48), iteration_s=0.03)
    simulate_prefill(log, plan)
    tokens = rng.randint(650, 1300)
    if number % 97 == 13:
        made = _decode(log, instance, task, tokens // 3, world, None)
        log.failed(task, "rank 1: RuntimeError: [METAL] command buffer failed", rank=1)
        return
    cancel_at = tokens // 2 if number % 50 == 7 else None
    made = _decode(log, instance, task, tokens, world, cancel_at)
    log.completed(task, "cancelled" if cancel_at is not None else "length", tokens=made)
    log.advance(0.05)


def _wedge(log: LogBuilder, number: int, instance: str, world: int) -> None:
    """A task whose prefill stops at iteration 3 with rank 1 stuck in compute (the rest wait)."""
    task = f"task_{number:06d}"
    log.task_created(task)
    log.task_assigned(task, instance)
    plan = PrefillPlan(task_id=task, instance_id=instance, world=world, chunks=16, stop_after_iteration=3)
    simulate_prefill(log, plan)
    for second in range(1, 61):
        log.advance(1)
        for rank in range(world):
            stack = COMPUTE_STACK if rank == 1 else COLLECTIVE_STACK
            log.heartbeat(instance, rank, "prefill", task, 3, second, stack if second >= 10 else None)


def generate(path: Path, tasks: int, seed: int, world: int = 2) -> int:
    """Write the export; returns the number of records."""
    rng = random.Random(seed)
    with path.open("wb", buffering=1 << 20) as out:
        log = LogBuilder(sink=lambda record: _write(out, record))
        nodes = [f"node_{i}" for i in range(2 * world)]
        log.ready_instance("inst_a", nodes[:world])
        log.ready_instance("inst_b", nodes[world:], model="tiny")
        for number in range(tasks - 1):
            _task(log, rng, number, "inst_a" if number % 2 == 0 else "inst_b", world)
        _wedge(log, tasks - 1, "inst_a", world)
        return log.event_seq + log.telemetry_seq


def _write(out: BinaryIO, record: ExportRecord) -> None:
    out.write(encode_record(record))
    out.write(b"\n")
