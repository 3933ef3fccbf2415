"""Before the first user: teach a batch its pace (`pace.py`), on every rank alike.

Rank 0 learns what a decode step costs against a prompt chunk from the steps it runs, so without
this the first long prompt that joins running streams after a start gets full chunks and freezes
their tokens for a whole chunk plus a decode step. Here a prompt of a few chunks prefills alone,
its chunks riding the batch's steps (the time per unit of chunk cost), and a short request
admitted beside it decodes on after it (a decode step's period), through the batch's own `step`:
the same synthetic requests, at the same steps, on every rank, so every rank issues the same
collectives as for any schedule (docs/ARCHITECTURE.md §6). (A chunk beside rows does not teach
on several ranks: rank 0 computes it while it waits for the others' decode anyway.) Their output
goes nowhere, and the prefix cache forgets them.
"""

from __future__ import annotations

from runner.engine.batch import ContinuousBatch
from runner.engine.batch_streams import Admission, still_pending
from runner.engine.plan import effective_step
from runner.engine.protocols import NeverCancelled, NullSink
from runner.engine.requests import GenerationRequest

ROW_PROMPT = [1, 2, 3, 4]  # small ids: within every vocabulary
ROW_AT_STEP = 1  # once the long prompt's first chunk is in: it decodes on after the prompt's last
CHUNKS = 3  # full chunks of the long prompt: each teaches the time per unit of chunk cost
MAX_STEPS = 400  # a bound on the loop; the row's max_tokens ends it long before


def warm_pace(batch: ContinuousBatch) -> None:
    """Run the teaching schedule to its end (the batch is idle again, its prefix cache empty)."""
    engine = batch.engine
    step = effective_step(engine.settings.prefill_step_size, engine.collectives.world)
    long_prompt = [1 + k % 15 for k in range(CHUNKS * step + 1)]
    row_tokens = 2 * (CHUNKS + 1 + engine.collectives.world) + 6  # decodes a few steps past the prompt's end
    long = GenerationRequest(
        task_id="warm-pace-chunks", prompt_token_ids=long_prompt, max_tokens=1, prefill_path="sequential"
    )
    row = GenerationRequest(task_id="warm-pace-row", prompt_token_ids=ROW_PROMPT, max_tokens=row_tokens)
    arrivals = {0: long, ROW_AT_STEP: row}
    pending: list[Admission] = []
    for steps in range(MAX_STEPS):
        if steps in arrivals:
            request = arrivals[steps]
            pending.append(Admission(request.task_id, request, NeverCancelled(), NullSink()))
        if not pending and not batch.busy:  # agreed: every rank breaks or waits alike
            if steps > ROW_AT_STEP:
                break
            continue
        result = batch.step(lambda: list(pending))
        pending[:] = still_pending(pending, result.admitted)
    batch.prefixes.clear()  # in place: the batch's newcomers look their prefixes up in this very index
