"""What a continuous batch holds and hands back: admissions in, streams within, endings out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from events.vocabulary import FinishReason, PrefillPath
from runner.engine.choices import row_id
from runner.engine.decode import DecodeSpec, Emitter
from runner.engine.plan import prefill_cost
from runner.engine.protocols import CancelSource, RunnerSink
from runner.engine.requests import ChoiceOutcome, GenerationOutcome, GenerationRequest, outcome_of
from runner.engine.task_run import TaskRun

CREATED_MISSING = "this rank was not handed the task's request"  # the masters refused, or none answered


@dataclass(frozen=True, slots=True)
class Admission:
    """An assignment as every rank builds it from the log: the request, or why it cannot run."""

    task_id: str
    request: GenerationRequest | None
    cancel: CancelSource
    sink: RunnerSink
    error: str | None = None  # set when the request could not be built (every rank alike)


@dataclass(frozen=True, slots=True)
class Ended:
    task_id: str
    outcome: GenerationOutcome | None  # None: failed, `error` says why
    error: str | None = None
    invalid_request: bool = False  # failed for the request itself (every rank refused it alike)


@dataclass(frozen=True, slots=True)
class StepResult:
    admitted: tuple[str, ...]  # the pending admissions that joined, in log order (not always the first)
    ended: list[Ended]
    kv: tuple[int, int] | None = None  # when members came or went: KV positions reserved, and held (agreed)


def still_pending(pending: Sequence[Admission], admitted: Sequence[str]) -> list[Admission]:
    """`pending` without the ones a step `admitted` (`StepResult.admitted`), in log order."""
    joined = set(admitted)
    return [a for a in pending if a.task_id not in joined]


@dataclass(slots=True)
class Stream:
    """One admitted task on this rank: its request, its run, where its prefill and decode are."""

    request: GenerationRequest
    run: TaskRun
    spec: DecodeSpec
    emitter: Emitter
    chunks: list[int]
    started: float
    path: PrefillPath = "sequential"
    next_chunk: int = 0
    prefill_cancelled: bool = False  # the pipeline prefill's own agreement stopped it
    decode_step: int = 0
    next_input: int = 0
    cached: int = 0  # prompt tokens reused from the prefix cache (agreed); the chunks cover the rest
    fed: list[int] = field(default_factory=list)  # agreed tokens, in order: the row holds KV up to the last but one
    lands_at: int = -1  # the step whose agreement sees its last chunk taken past the last rank (`chunk_ring`)
    reserved: int = 0  # KV positions it may come to hold (`kv_budget.reservation`), from its request
    choice: int = 0  # which of its task's completions this row decodes (`choices.py`)
    leader: str | None = None  # a follower: the row whose prompt KV it is handed (`choices.py`)

    @property
    def row(self) -> str:
        """Its key in the batch (`choices.row_id`)."""
        return row_id(self.request.task_id, self.choice)

    @property
    def prefilled(self) -> bool:
        """Every chunk taken (some may still be on their way through the ranks: `landed`)."""
        return self.chunks_left == 0

    @property
    def chunks_left(self) -> int:
        return len(self.chunks) - self.next_chunk

    def landed(self, step: int) -> bool:
        """Every chunk taken and past the last rank by `step`'s agreement: it may join the rows."""
        return self.prefilled and self.lands_at <= step

    @property
    def prompt_done(self) -> int:
        """Prompt tokens whose KV it holds: the cached prefix, then the chunks taken so far."""
        return self.cached + sum(self.chunks[: self.next_chunk])

    def ended(self, finish_reason: FinishReason) -> Ended:
        """How it leaves the batch: its outcome, or the failure of its sink or cancel source."""
        result, run = self.emitter.result, self.run
        if run.callback_errors:
            first = run.callback_errors[0]
            return Ended(run.task_id, None, f"the sink or cancel source failed: {type(first).__name__}: {first}")
        outcome = outcome_of(
            self.request,
            run,
            self.path,
            finish_reason,
            result.token_ids,
            result.text,
            self.spec.prefill_iterations,
            self.started,
            result.first_token_at,
            self.cached,
            stop_sequence=result.stop_sequence,
        )
        return Ended(run.task_id, outcome)

    def next_chunk_cost(self, keys: float | None) -> float | None:
        """What its next prompt chunk costs (`plan.prefill_cost`); None once its prompt is in."""
        if self.prefilled:
            return None
        return prefill_cost(self.chunks[self.next_chunk], self.prompt_done, keys)


def merged(task_id: str, parts: Mapping[int, Ended]) -> Ended:
    """One ending for a task of several choices, once every choice's row has left (`parts`, by
    choice): its failure if one failed; else choice 0's outcome, with every choice's completion
    tokens counted and each choice's end listed (`GenerationOutcome.choices`)."""
    failed = next((parts[c] for c in sorted(parts) if parts[c].outcome is None), None)
    if failed is not None:
        return Ended(task_id, None, failed.error, failed.invalid_request)
    outcomes = [(c, parts[c].outcome) for c in sorted(parts)]
    first = outcomes[0][1]
    assert first is not None
    ends = [
        ChoiceOutcome(
            index=c,
            finish_reason=o.finish_reason,
            completion_tokens=o.completion_tokens,
            text=o.text,
            stop_sequence=o.stop_sequence,
        )
        for c, o in outcomes
        if o is not None
    ]
    total = sum(end.completion_tokens for end in ends)
    return Ended(task_id, msgspec.structs.replace(first, completion_tokens=total, choices=ends))
