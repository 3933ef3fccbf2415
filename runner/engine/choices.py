"""A task's several completions (`GenerationRequest.n`, OpenAI's `n`) as rows of the batch, pure.

A task of n choices is admitted as n rows at once (`step_plan.next_composition` counts its
width against `max_batch`, and its KV reservation n times): choice 0 is the task's own row and
prefills the prompt; choices 1..n-1 follow it (`Stream.leader`): they take no prompt chunk, and at
the step the leader's prefill lands every follower gets a copy of the leader's prompt KV
(`ContinuousBatch._hand_prompt`), so the prompt is prefilled once whatever n is. From then on each
row decodes alone: its first step runs the prompt's last token through the model (as every row's
first step does) and samples with its own seed stream (`choice_seed`), so the n rows draw n
different samples at a temperature above 0, the same one at 0.

Every decision here is agreed data on every rank: the rows' ids and widths come from the request
(built alike from the log on every rank), and a follower lands at the step its leader lands, which
every rank derives from the same agreed steps. No collective is added: the copy is local to each
rank's own layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from runner.engine.protocols import NullSink

if TYPE_CHECKING:
    from events.logprobs import TokenLogprob
    from runner.engine.protocols import RunnerSink

CHOICE_SEPARATOR = "#"  # never in a task id (a subject token: `events.ids`)
_MASK = (1 << 63) - 1  # a seed the runner's RNG takes: 0 .. 2**63 - 1 (`services/api/schemas.SEED_MAX`)
_GOLDEN = 0x9E3779B97F4A7C15
WAITING_FOR_LEADER = 1 << 62  # a follower's `Stream.lands_at` until it is handed the leader's prompt KV


def row_id(task_id: str, choice: int) -> str:
    """The batch's key for one choice's row: the task id for choice 0 (a task of one completion is
    keyed as before), `task#i` for the others."""
    return task_id if choice == 0 else f"{task_id}{CHOICE_SEPARATOR}{choice}"


def task_of(row: str) -> str:
    """The task a row belongs to."""
    return row.split(CHOICE_SEPARATOR, 1)[0]


def choice_rows(task_id: str, n: int) -> tuple[str, ...]:
    """The rows of a task of `n` choices, choice 0 first."""
    return tuple(row_id(task_id, choice) for choice in range(max(1, n)))


def choice_seed(seed: int | None, choice: int) -> int | None:
    """Choice `choice`'s own seed: the request's for choice 0 (so n=1 and n>1 agree on it), and for
    the others a splitmix64 mix of (seed, choice), a stream of its own that no small change of the
    request's seed lands on (seed s's choice 1 is not seed s+1's choice 0). None stays None: an
    unseeded row draws from the process's generator, which every draw advances."""
    if seed is None or choice == 0:
        return seed
    z = (seed + _GOLDEN * choice) & ((1 << 64) - 1)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 31)) & _MASK


def admission_width(n: int, max_batch: int) -> int:
    """The rows a task of `n` choices takes when admitted. One wider than the batch could never be
    admitted, so it is admitted as one row, to be refused at once (`step_plan.plan_step`)
    rather than to wait for ever at the head of the log."""
    return n if 1 <= n <= max_batch else 1


class ChoiceSink(NullSink):
    """A follower's sink (`RunnerSink`): its tokens go out as its choice's; the prompt's prefill is
    the leader's to report (it has none of its own, so the prefill reports go nowhere)."""

    def __init__(self, inner: RunnerSink, choice: int) -> None:
        self.inner, self.choice = inner, choice

    def tokens(
        self,
        task_id: str,
        index: int,
        text: str,
        token_ids: list[int],
        logprobs: list[TokenLogprob] | None = None,
        choice: int = 0,
    ) -> None:
        self.inner.tokens(task_id, index, text, token_ids, logprobs, choice=self.choice)


def hands_prompt(slots: Sequence[object]) -> str | None:
    """Why a model's caches (`ShardCache.slots`: every layer's, so the verdict is alike on every
    rank) cannot hand one row's prompt KV to another, or None: a follower's copy is cut from the
    leader's plain or quantized KV (`batch_cache.prefix_caches`); a sliding window or a recurrent
    state cannot be copied that way."""
    kinds = sorted(
        {type(slot).__name__ for slot in slots if type(slot).__name__ not in ("KVCache", "QuantizedKVCache")}
    )
    if not kinds:
        return None
    return (
        f"n > 1 is not supported for this model: its layers keep {', '.join(kinds)}, which cannot hand the "
        "prompt's KV from one choice to the others; send one request per completion"
    )
