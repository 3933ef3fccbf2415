"""A prompt's prefill outside the batch's steps: the overlapped GPipe schedule (`plan.rank_schedule`)
of a prompt admitted into an empty batch (`batch.ContinuousBatch._pipeline_prefill`), and the
forward of one prompt chunk that it and the batch's pipelined chunks (`batch_prefill`) share.

The whole prefill processes the first L-1 prompt tokens and reports progress exactly like mlx-lm's
`generate_step` (the last token goes through the first decode step). A rank's sends of an iteration
start only after that iteration's agreement on cancel, so on an agreed stop no receiver is left
waiting and no send is left unreceived.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import mlx.core as mx

from runner.engine.task_run import TaskRun


@dataclass(frozen=True, slots=True)
class PrefillResult:
    iterations: int  # iterations this rank ran, idle ones and a cancelled one included
    cancelled: bool


def run_pipeline_prefill(
    run: TaskRun, prompt: mx.array, chunks: list[int], schedule: list[int | None]
) -> PrefillResult:
    """`schedule`: this rank's chunk at each iteration (None: idle), the same length on every rank."""
    total = int(prompt.shape[0])
    starts = [0, *accumulate(chunks)]
    run.report_progress(0, total, 0)
    try:
        for iteration, chunk in enumerate(schedule):
            run.phases.enter("prefill", run.task_id, iteration)
            if chunk is not None:
                compute_chunk(run, prompt[starts[chunk] : starts[chunk + 1]])
            if run.agree_to_stop("prefill", iteration):
                run.outbox.discard_queued()
                return PrefillResult(iteration + 1, cancelled=True)
            run.outbox.flush()
            if chunk is not None:
                run.report_progress(starts[chunk + 1], total, iteration + 1)
        run.outbox.complete()
    except BaseException:
        # A failed transfer or collective leaves the group unusable; waiting on our sends could
        # block on a dead peer, so forget them and let the error name what failed.
        run.outbox.abandon()
        raise
    return PrefillResult(len(schedule), cancelled=False)


def compute_chunk(run: TaskRun, piece: mx.array) -> None:
    """`piece`: [n] prompt tokens, or [k, n]: k prompts' chunks of one length (`batch_prefill`). Its
    send stays queued: it starts after the step's (or the iteration's) agreement."""
    run.forward(piece if piece.ndim == 2 else piece[None])
    mx.eval([*run.caches.states(), *run.outbox.activations()])
    mx.clear_cache()
