"""Logs of an instance serving several tasks in one batch (continuous batching), for diagnose and
the timeline: the same `LogBuilder` shapes as `scenarios`, with every rank's heartbeat naming its
batch and the master's watchdog run on the log as it stands."""

from __future__ import annotations

from services.ops.synthetic import COMPUTE_STACK, LogBuilder, PrefillPlan, simulate_decode, simulate_prefill
from tests.ops.scenarios import AGREE_STACK, NODES, watchdog_ticks

BATCH = ("t1", "t2")


def batch_decoding(tokens: int = 10) -> LogBuilder:
    """A ready 2-rank instance; t1 and t2 assigned, prefilled one after the other, then decoding
    together: one chunk of each per step, and 1 Hz heartbeats naming both."""
    log = LogBuilder()
    log.ready_instance("i1", NODES)
    log.advance(1)
    for task in BATCH:
        log.task_created(task)
        log.task_assigned(task, "i1")
    for task in BATCH:
        simulate_prefill(log, PrefillPlan(task_id=task, instance_id="i1", world=2, chunks=2, heartbeats=False))
    for index in range(tokens):
        log.advance(0.05)
        for task in BATCH:
            log.chunk(task, index)  # from the sampling rank
        if index % 20 == 0:
            for rank in (0, 1):
                log.heartbeat("i1", rank, "decode", BATCH[0], index, 0.01, batch=BATCH)
    return log


def batch_rank_stalls_in_compute() -> LogBuilder:
    """Mid-decode rank 1 stalls in compute; rank 0 waits for it in the step's all-reduce. The
    watchdog gives the batch's head up and retires the instance, which fails both tasks."""
    log = batch_decoding()
    for second in range(12):
        log.advance(1)
        age = second + 1
        waiting, computing = (AGREE_STACK, COMPUTE_STACK) if age >= 5 else (None, None)
        log.heartbeat("i1", 0, "agree_cancel", BATCH[0], 10, age, waiting, batch=BATCH)
        log.heartbeat("i1", 1, "decode", BATCH[0], 10, age, computing, batch=BATCH)
    watchdog_ticks(log, stall_s=12)
    return log


def batch_completed() -> LogBuilder:
    log = batch_decoding()
    for task in BATCH:
        log.completed(task, tokens=10)
    return log


def one_after_another() -> LogBuilder:
    """The same instance serving t1 to its end, then t2: no batch."""
    log = LogBuilder()
    log.ready_instance("i1", NODES)
    for task in BATCH:
        log.advance(1)
        log.task_created(task)
        log.task_assigned(task, "i1")
        simulate_prefill(log, PrefillPlan(task_id=task, instance_id="i1", world=2, chunks=2, heartbeats=False))
        simulate_decode(log, task, 5)
        log.completed(task, tokens=5)
    return log
