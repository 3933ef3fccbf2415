"""A scripted continuous batch on a local rank (a task of `"kind": "batch"` in a test job).

A schedule lists requests with the step at which each reaches the rank (`at`, plus a per-rank
`lag`, so ranks read the same assignments at different times, as they do from the log; an `at` of
N.5 reaches it while step N's forward runs, and counts in that step's agreement) and
optional cancels (`cancel_rank`, `cancel_at_poll`: that rank's cancel source fires from its poll
N of that task on; or `cancel_at_step`: every rank's cancel source flips before its step N, as a
cancel read from the log would, whenever the engine polls it; `unreadable_rank`: that rank has no request for it, as when its
read of the task's TaskCreated fails), and conversations (`after`: the
request continues that task, so its prompt is that task's prompt, its generated tokens, then its
own tokens; it reaches the rank once that task ended). `lockstep_decode` has every rank vote for the
lockstep decode (`shared_cores.py`). `prefix_cache_bytes` may set a bound per
rank; `warm_pace` measures the chunks' rate (`Engine.calibrate_prefill`) and teaches the batch its pace first, as the service does. The rank drives `ContinuousBatch` the way the service's task loop does: it steps while the
batch is busy and, while it is empty, waits (jumps its clock) to its next arrival. Each ended task
is recorded with its sink (with `token_times`) and `timing`; the run with its `step_times`: the
benches' timestamps, monotonic seconds (one clock for every local rank), never read by the engine.
SHOAL_TEST_FAULT counts the polls of the first admitted task, as in the service, where one
injector wraps the cancel source of every task.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from runner.engine.protocols import CancelSource, NeverCancelled, PhaseTracker
from runner.flight.faults import FaultInjector
from runner.local.testing.tools import FixedCancel, RecordingSink

if TYPE_CHECKING:
    from runner.engine.batch_streams import Admission
    from runner.engine.engine import Engine


def run_schedule(
    engine: Engine, schedule: dict[str, Any], rank: int, faults: FaultInjector, phases: PhaseTracker
) -> dict[str, Any]:
    from runner.engine.batch import ContinuousBatch
    from runner.engine.batch_streams import still_pending
    from runner.engine.shared_cores import LOCKSTEP_WEIGHT_BYTES, agreed_cores
    from runner.preparer import ThreadedPreparer

    bound = schedule.get("prefix_cache_bytes", {}).get(str(rank))  # a rank-specific bound (None: the setting)
    warm = bool(schedule.get("warm_pace"))  # as the service does before serving: the chunks' rate, then the pace
    if warm:
        engine.calibrate_prefill()
    on_loop = bool(schedule.get("prepare_on_loop"))  # the benches' contrast: grammars compiled on the step loop
    # as the service does: the decode mode agreed (`lockstep_decode`: every rank votes for lockstep)
    cores = agreed_cores(engine, os.environ, 0 if schedule.get("lockstep_decode") else LOCKSTEP_WEIGHT_BYTES)
    preparer = None if on_loop else ThreadedPreparer(engine.prepare)
    batch = ContinuousBatch(engine, phases, schedule["max_batch"], bound, preparer, cores)
    if warm:
        from runner.engine.batch_warmup import warm_pace

        warm_pace(batch)
    arrivals: list[tuple[int, dict[str, Any]]] = []
    for entry in schedule["tasks"]:  # listed in log order: a rank never reads one before an earlier one
        at = entry["at"] + entry.get("lag", {}).get(str(rank), 0)
        arrivals.append((max(at, arrivals[-1][0]) if arrivals else at, entry))
    sinks: dict[str, TimedSink] = {}
    flips = _step_cancels(schedule["tasks"])
    steps_at: list[tuple[float, float]] = []
    ended: dict[str, Any] = {}
    pending: list[Admission] = []
    prompts: dict[str, list[int]] = {}
    admitted_at: dict[str, int] = {}  # task -> the step whose agreement admitted it
    clock, received, steps, overlapped = 0, 0, 0, 0

    def read(until: float) -> None:
        """The assignments that arrived by `until`, in log order."""
        nonlocal received
        while received < len(arrivals) and arrivals[received][0] <= until:
            entry = arrivals[received][1]
            if entry.get("after") is not None and entry["after"] not in ended:
                break  # the batch is busy with the task it continues: it ends at the same step everywhere
            entry = _continued(entry, ended, prompts)
            prompts[entry["request"]["task_id"]] = entry["request"]["prompt_token_ids"]
            pending.append(_admission(entry, rank, faults, sinks, flips))
            received += 1

    def read_during_step() -> list[Admission]:
        """An `at` of N.5 arrives while step N's forward runs: read only once it ran (the batch
        has gone on to its agreement), as the service's inbox holds it only from then."""
        read(clock + 0.5 if phases.snapshot().phase == "agree_cancel" else clock)
        return list(pending)

    while received < len(arrivals) or pending or batch.busy:
        if not batch.busy and not pending:
            clock = max(clock, math.ceil(arrivals[received][0]))  # idle: wait for the next assignment
        read(clock)
        for flip in flips.get(steps, ()):
            flip.cancelled, flip.flipped_at = True, time.monotonic()
        started = time.monotonic()
        result = batch.step(read_during_step)
        steps_at.append((started, time.monotonic()))
        overlapped += sum(1 for part in batch.micro.parts if part.rows) >= 2  # ranks on different ones
        admitted_at.update((t, steps) for t in result.admitted)
        pending[:] = still_pending(pending, result.admitted)
        for done in result.ended:
            left = {"admitted_step": admitted_at.get(done.task_id), "left_step": steps, "left_at": steps_at[-1][1]}
            left |= _flipped(flips, done.task_id)
            ended[done.task_id] = _record(done, sinks[done.task_id]) | {"timing": left}
        clock, steps = clock + 1, steps + 1
    prefixes = {"nbytes": batch.prefixes.nbytes, "bound": batch.prefixes.max_bytes, "entries": len(batch.prefixes)}
    return {
        "kind": "batch",
        "ended": ended,
        "steps": steps,
        "prefix_cache": prefixes,
        "overlapped_steps": overlapped,
        "lockstep": batch.cores.lockstep,
        "speculated_steps": batch.row_decoder.speculated_steps,
        "taken_back_steps": batch.row_decoder.taken_back_steps,
        "step_times": steps_at,
        "keys_per_token": engine.prefill_keys_per_token,
    }


@dataclass(slots=True)
class TimedSink(RecordingSink):
    """A recording sink that also notes when each token reached it (the benches' inter-token times)."""

    token_times: list[float] = field(default_factory=list)

    def tokens(
        self, task_id: str, index: int, text: str, token_ids: list[int], logprobs: Any = None, choice: int = 0
    ) -> None:
        RecordingSink.tokens(self, task_id, index, text, token_ids, logprobs, choice)
        self.token_times.extend([time.monotonic()] * len(token_ids))


@dataclass(slots=True)
class StepCancel(FixedCancel):
    """`cancel_at_step`: flipped by the schedule before step N, whenever the engine polls it;
    `seen_at`: the first poll that found it flipped."""

    task_id: str = ""
    flipped_at: float | None = None
    seen_at: float | None = None

    def is_cancelled(self, task_id: str) -> bool:
        if self.cancelled and self.seen_at is None:
            self.seen_at = time.monotonic()
        return self.cancelled


def _step_cancels(tasks: list[dict[str, Any]]) -> dict[int, list[StepCancel]]:
    flips: dict[int, list[StepCancel]] = {}
    for entry in tasks:
        if entry.get("cancel_at_step") is not None:
            flip = StepCancel(False, entry["request"]["task_id"])
            flips.setdefault(entry["cancel_at_step"], []).append(flip)
    return flips


def _flipped(flips: dict[int, list[StepCancel]], task_id: str) -> dict[str, float | None]:
    flip = next((f for at in flips.values() for f in at if f.task_id == task_id), None)
    return {"cancel_flipped_at": flip and flip.flipped_at, "cancel_seen_at": flip and flip.seen_at}


def _continued(entry: dict[str, Any], ended: dict[str, Any], prompts: dict[str, list[int]]) -> dict[str, Any]:
    """The entry with its full prompt when it continues an earlier task (a conversation's next turn)."""
    earlier = entry.get("after")
    if earlier is None:
        return entry
    history = [*prompts[earlier], *ended[earlier]["token_ids"]]
    request = entry["request"]
    return {**entry, "request": {**request, "prompt_token_ids": history + request["prompt_token_ids"]}}


def _admission(
    entry: dict[str, Any],
    rank: int,
    faults: FaultInjector,
    sinks: dict[str, TimedSink],
    flips: dict[int, list[StepCancel]],
) -> Admission:
    from runner.engine.batch_streams import CREATED_MISSING, Admission
    from runner.engine.requests import GenerationRequest
    from runner.local.rank_main import CancelAtPoll

    request = msgspec.convert(entry["request"], GenerationRequest)
    cancel: CancelSource = NeverCancelled()
    if entry.get("cancel_rank") == rank:
        cancel = CancelAtPoll(entry["cancel_at_poll"])
    if entry.get("cancel_at_step") is not None:
        cancel = next(f for f in flips[entry["cancel_at_step"]] if f.task_id == request.task_id)
    sinks[request.task_id] = TimedSink()
    if entry.get("unreadable_rank") == rank:  # as a rank whose read of TaskCreated failed
        return Admission(request.task_id, None, faults.around(cancel), sinks[request.task_id], CREATED_MISSING)
    return Admission(request.task_id, request, faults.around(cancel), sinks[request.task_id])


def _record(done: Any, sink: TimedSink) -> dict[str, Any]:
    if done.outcome is None:
        return {"task_id": done.task_id, "error": done.error}
    return {**msgspec.to_builtins(done.outcome), "sink": msgspec.to_builtins(sink)}
