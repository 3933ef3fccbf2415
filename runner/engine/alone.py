"""A request served alone: a batch of one, stepped by `ContinuousBatch.step` like every served task.

`shoal generate`, the warm-up, the benches' engine alone and the tests' references hand one request
to a batch of its own and step it until the request has ended and nothing of it is left in flight.
There is no other way to run a request: what holds for a batch (every rank issues the same
collectives, decided from agreed data only: docs/ARCHITECTURE.md §6) holds for it, and a request
served alone decodes the same greedy tokens as in a served batch. What a task alone had still
holds here: admitted into an empty batch, a prompt of several chunks takes the overlapped GPipe
prefill on several ranks (`batch._pipeline_prefill`), one rank's rows use mlx-lm's look-ahead
(`batch_rows`), and its cancel vote rides every step's all-reduce.

The batch of one has no prefix cache (nothing would ever reuse it) and a pace of its own: with no
rows beside its chunks nothing reads a pace, and the engine's stays what the served batch learns
(`Engine.calibrate_prefill` must come before that is first read).
"""

from __future__ import annotations

from runner.engine.batch import ContinuousBatch
from runner.engine.batch_streams import Admission, Ended, still_pending
from runner.engine.engine import Engine
from runner.engine.pace import StepPace
from runner.engine.plan import effective_step, prefill_cost
from runner.engine.protocols import NeverCancelled, NullSink, PhaseTracker
from runner.engine.requests import GenerationRequest

WARM_UP_PROMPT = [0, 1, 2, 3]  # small ids: within every vocabulary


def alone_batch(engine: Engine, phases: PhaseTracker) -> ContinuousBatch:
    """An empty batch of one (built alike on every rank: no collective)."""
    step = effective_step(engine.settings.prefill_step_size, engine.collectives.world)
    pace = StepPace(prefill_cost(step, 0, engine.prefill_keys_per_token))
    return ContinuousBatch(engine, phases, max_batch=1, prefix_cache_bytes=0, pace=pace)


def serve_alone(batch: ContinuousBatch, admission: Admission) -> Ended:
    """Step `batch` (empty) until `admission`'s request has ended and the batch is idle again. Every
    rank holds the admission from the start, so the first step admits it on every rank, and every
    rank steps while the batch is busy (agreed data): the same steps everywhere."""
    if batch.busy:
        raise RuntimeError("internal error: a request served alone needs an empty batch")
    pending = [admission]
    ended: Ended | None = None
    while pending or batch.busy:
        result = batch.step(lambda: list(pending))
        pending[:] = still_pending(pending, result.admitted)
        ended = next((e for e in result.ended if e.task_id == admission.task_id), ended)
    if ended is None:
        raise RuntimeError(f"internal error: {admission.task_id} left the batch without an ending")
    return ended


def warm_up(engine: Engine, phases: PhaseTracker) -> None:
    """A tiny request through the batch loop so the first real one does not pay for setup (every
    rank, at the same point)."""
    phases.enter("warming_up")
    request = GenerationRequest(task_id="warmup", prompt_token_ids=WARM_UP_PROMPT, max_tokens=2)
    ended = serve_alone(alone_batch(engine, phases), Admission(request.task_id, request, NeverCancelled(), NullSink()))
    if ended.outcome is None:
        raise RuntimeError(f"the warm-up failed: {ended.error}")
