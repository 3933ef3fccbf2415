"""The two prefill paths. Both process the first L-1 prompt tokens and report progress exactly
like mlx-lm's `generate_step`; the last token goes through the first decode step.

Sequential: one chunk travels through every rank (recv, compute, send at once), then the
ranks agree on cancel. Pipeline: the GPipe schedule from `plan.rank_schedule`; a rank's sends
of an iteration start only after that iteration's agreement, so on an agreed stop no receiver
is left waiting and no send is left unreceived.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import mlx.core as mx

from events.vocabulary import PrefillPath
from runner.engine.task_run import TaskRun


@dataclass(frozen=True, slots=True)
class PrefillResult:
    iterations: int  # iterations this rank ran, idle ones and a cancelled one included
    cancelled: bool


def run_prefill(
    run: TaskRun, prompt: mx.array, chunks: list[int], schedule: list[int | None], path: PrefillPath
) -> PrefillResult:
    total = int(prompt.shape[0])
    starts = [0, *accumulate(chunks)]
    run.report_progress(0, total, 0)
    try:
        for iteration, chunk in enumerate(schedule):
            run.phases.enter("prefill", run.task_id, iteration)
            if chunk is not None:
                compute_chunk(run, prompt[starts[chunk] : starts[chunk + 1]], path)
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


def compute_chunk(run: TaskRun, piece: mx.array, path: PrefillPath) -> None:
    """`piece`: [n] prompt tokens, or [k, n]: k prompts' chunks of one length (`batch_prefill`)."""
    mark = run.outbox.mark()  # sends queued before (a pipelined decode's) wait for their agreement
    run.forward(piece if piece.ndim == 2 else piece[None])
    if path == "sequential":
        # The next rank needs this chunk before anyone can reach the agreement collective.
        mx.eval([*run.caches.states(), *run.outbox.take_all(since=mark)])
    else:
        mx.eval([*run.caches.states(), *run.outbox.activations()])
    mx.clear_cache()
