"""A test job's tasks on a local rank (`"testing": true` in the job: `runner.local.rank_main`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from runner.engine.protocols import CancelSource, PhaseTracker
from runner.flight.faults import FaultInjector
from runner.local.rank_main import task_cancel
from runner.local.testing.tools import BrokenCancel, FixedCancel, RecordingSink, mlx_reference

if TYPE_CHECKING:
    from runner.engine.engine import Engine
    from runner.engine.shard import LoadedShard


def run_test_task(
    engine: Engine, shard: LoadedShard, task: dict[str, Any], rank: int, faults: FaultInjector, phases: PhaseTracker
) -> dict[str, Any]:
    """mlx-lm's reference, a scripted batch (`schedule`), or a request served alone as `shoal
    generate` serves it, its callbacks recorded."""
    from runner.local.testing.schedule import run_schedule

    if task.get("kind") == "mlx_reference":
        return mlx_reference(shard, task)
    if task.get("kind") == "batch":
        return run_schedule(engine, task, rank, faults, phases)
    return served_alone(engine, task, rank, faults, phases)


def served_alone(
    engine: Engine, task: dict[str, Any], rank: int, faults: FaultInjector, phases: PhaseTracker
) -> dict[str, Any]:
    """The request alone (`runner.engine.alone`): its outcome and sink, or why it failed."""
    from runner.engine.alone import alone_batch, serve_alone
    from runner.engine.batch_streams import Admission
    from runner.engine.requests import GenerationRequest

    request = msgspec.convert(task["request"], GenerationRequest)
    sink = RecordingSink(fail_on_tokens=task.get("failing_sink_rank") == rank)
    admission = Admission(request.task_id, request, faults.around(cancel_for(task, rank)), sink)
    ended = serve_alone(alone_batch(engine, phases), admission)
    if ended.outcome is None:
        return {"task_id": request.task_id, "error": ended.error, "invalid_request": ended.invalid_request}
    return {**msgspec.to_builtins(ended.outcome), "sink": msgspec.to_builtins(sink)}


def cancel_for(task: dict[str, Any], rank: int) -> CancelSource:
    """`cancel_before_start_ranks`, `failing_cancel_rank`, or `shoal generate`'s own cancel keys."""
    if rank in task.get("cancel_before_start_ranks", []):
        return FixedCancel(True)
    if task.get("failing_cancel_rank") == rank:
        return BrokenCancel()
    return task_cancel(task, rank)
