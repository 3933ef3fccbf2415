"""Continuous batching on one rank: streams join at step boundaries and leave alone.

One `step` on every rank: the decoding rows take one token together ([B, 1] through the shard,
every rank in turn), the first stream still prefilling takes one prompt chunk (sequentially
through every rank: a long prompt never freezes the rows' tokens for more than a chunk), then one
all-reduce (`batch_plan.StepLayout`) agrees on the tokens, the cancel votes and how many
assignments every rank holds. The next batch follows from that vector alone
(`batch_plan.next_composition`), so every rank runs the same forwards and the same collective at
every step (docs/ARCHITECTURE.md §6). A stream's prefill chunks are the ones it would take alone
(`plan.chunk_sizes` of the instance's step), and its sampler, stop rules, logprobs and grammar
are its own; a cancelled, finished or failing stream leaves without touching the others' rows.
A decoding row that leaves is copied into the rank's prefix cache (`prefix_cache`), and a newcomer
starts from the prefix every rank agreed it can reuse (the step's all-reduce carries the proposals).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import greedy_sampler

from runner.engine.batch_cache import BatchShardCache, prefix_caches
from runner.engine.batch_plan import AgreedStep, Composition, StepLayout, next_composition
from runner.engine.decode import DecodeSpec, Emitter, sample_token
from runner.engine.engine import Engine, GenerationOutcome, GenerationRequest, outcome_of
from runner.engine.logprobs import LazyLogprobs
from runner.engine.plan import chunk_sizes, effective_step
from runner.engine.prefill import compute_chunk
from runner.engine.prefix_cache import PrefixIndex, PrefixMatch
from runner.engine.protocols import CancelSource, PhaseTracker, RunnerSink
from runner.engine.task_run import TaskRun
from runner.errors import RequestError


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


@dataclass(frozen=True, slots=True)
class StepResult:
    admitted: int  # how many of the pending admissions joined (the first ones, in log order)
    ended: list[Ended]


@dataclass(slots=True)
class _Stream:
    request: GenerationRequest
    run: TaskRun
    spec: DecodeSpec
    emitter: Emitter
    chunks: list[int]
    started: float
    next_chunk: int = 0
    decode_step: int = 0
    next_input: int = 0
    logprobs: LazyLogprobs | None = field(default=None)
    cached: int = 0  # prompt tokens reused from the prefix cache (agreed); the chunks cover the rest
    fed: list[int] = field(default_factory=list)  # agreed tokens, in order: the row holds KV up to the last but one

    @property
    def prefilled(self) -> bool:
        return self.next_chunk == len(self.chunks)


def _is_plain_greedy(spec: DecodeSpec) -> bool:
    """Argmax of the logits, no logprobs, no grammar: the same token as the row's own sampler."""
    return spec.sampler is greedy_sampler and spec.top_logprobs is None and spec.token_mask is None


class ContinuousBatch:
    """One rank's running batch. Every rank calls `step` at the same points: whenever the batch is
    `busy` (agreed), and otherwise once it holds an admission not yet admitted (every rank will)."""

    def __init__(
        self, engine: Engine, phases: PhaseTracker, max_batch: int, prefix_cache_bytes: int | None = None
    ) -> None:
        """`prefix_cache_bytes`: None takes the instance's setting (tests give ranks different bounds)."""
        if engine.settings.kv_bits is not None:
            raise ValueError("continuous batching needs an unquantized KV cache (kv_bits is set)")
        self.engine, self.phases = engine, phases
        self.max_batch = max_batch
        self.layout = StepLayout(engine.collectives.world, max_batch)
        self.composition = Composition()
        self.streams: dict[str, _Stream] = {}
        self.cache: BatchShardCache | None = None
        self.steps = 0
        bound = engine.settings.prefix_cache_bytes if prefix_cache_bytes is None else prefix_cache_bytes
        self.prefixes: PrefixIndex[list[Any]] = PrefixIndex(bound)
        self.held: dict[str, PrefixMatch[list[Any]] | None] = {}  # pending task -> its proposal, until admitted

    @property
    def busy(self) -> bool:
        return bool(self.composition.members)

    @property
    def members(self) -> tuple[str, ...]:
        return self.composition.members

    def step(self, pending: Sequence[Admission]) -> StepResult:
        """One step; `pending`: this rank's admissions not yet admitted, in log order."""
        try:
            return self._step(pending)
        except BaseException:
            self.engine.shard.outbox.abandon()  # never wait on a peer that may be gone
            raise

    def _step(self, pending: Sequence[Admission]) -> StepResult:
        members = self.composition.members
        self.phases.enter("decode", members[0] if members else None, self.steps)
        tokens, logprobs = self._decode_rows()
        head = self._prefill_head()
        votes = [self._vote(self.streams[t]) for t in members]
        self.phases.enter("agree_cancel", members[0] if members else None, self.steps)
        received = self.composition.admitted + len(pending)
        vector = self.layout.encode(self.engine.rank, received, votes, tokens, self._propose(pending))
        agreed = self.layout.decode(self.engine.collectives.agree(vector))
        self.steps += 1
        ended = self._apply(agreed, logprobs, head, pending)
        members = self.composition.members
        self.phases.enter("decode" if members else "idle", members[0] if members else None, self.steps)
        return ended

    def _decode_rows(self) -> tuple[list[int], list[LazyLogprobs | None]]:
        rows = [self.streams[t] for t in self.composition.rows]
        if not rows or self.cache is None:
            return [], []
        engine = self.engine
        inputs = mx.array([[s.next_input] for s in rows], dtype=mx.int32)
        logits = engine.shard.model(inputs, cache=self.cache.slots)
        if not engine.is_sampling_rank:
            mx.eval([*self.cache.states(), *engine.shard.outbox.take_all()])
            return [0] * len(rows), [None] * len(rows)
        if all(_is_plain_greedy(s.spec) for s in rows):  # one argmax for the whole batch
            sampled = mx.argmax(logits[:, -1, :], axis=-1)
            drawn: list[tuple[Any, LazyLogprobs | None]] = [(None, None)] * len(rows)
        else:
            drawn = [sample_token(logits[i : i + 1, -1, :], s.spec) for i, s in enumerate(rows)]
            sampled = mx.concatenate([token.reshape(1) for token, _ in drawn])
        mx.eval(sampled, *(a for _, lp in drawn for a in (lp or ())), *self.cache.states())
        return [int(t) for t in sampled.tolist()], [lp for _, lp in drawn]  # pyright: ignore[reportGeneralTypeIssues]

    def _prefill_head(self) -> _Stream | None:
        """The first prefilling stream's next chunk, sequentially through every rank."""
        if not self.composition.prefilling:
            return None
        head = self.streams[self.composition.prefilling[0]]
        if not head.prefilled:
            start = head.cached + sum(head.chunks[: head.next_chunk])
            piece = mx.array(
                head.request.prompt_token_ids[start : start + head.chunks[head.next_chunk]], dtype=mx.int32
            )
            compute_chunk(head.run, piece, "sequential")
        return head

    def _vote(self, stream: _Stream) -> bool:
        if stream.prefilled and stream.decode_step % stream.spec.cancel_interval != 0:
            return False  # decode polls every `decode_cancel_poll_tokens` steps, as a task alone does
        return stream.run.wants_stop()

    def _apply(
        self,
        agreed: AgreedStep,
        logprobs: list[LazyLogprobs | None],
        head: _Stream | None,
        pending: Sequence[Admission],
    ) -> StepResult:
        current = self.composition
        stopped: set[str] = set()
        for slot, task_id in enumerate(current.rows):
            stream = self.streams[task_id]
            if not agreed.cancelled[slot] and stream.emitter.accept(
                stream.decode_step, agreed.tokens[slot], logprobs[slot]
            ):
                stopped.add(task_id)
            stream.next_input = agreed.tokens[slot]
            stream.fed.append(agreed.tokens[slot])
            stream.decode_step += 1
            if stream.decode_step >= stream.spec.max_tokens:
                stopped.add(task_id)
        head_cancelled = head is not None and agreed.cancelled[len(current.rows)]
        if head is not None and not head_cancelled and not head.prefilled:
            head.next_chunk += 1
            done = head.cached + sum(head.chunks[: head.next_chunk])
            head.run.report_progress(done, len(head.request.prompt_token_ids), head.next_chunk)
        transition = next_composition(
            current, agreed, stopped_rows=frozenset(stopped), head_prefilled=head is not None and head.prefilled,
            pending=[a.task_id for a in pending], max_batch=self.max_batch,
        )  # fmt: skip
        self._remember(current.rows, transition.kept_rows)
        self._reshape_cache(transition.kept_rows, transition.joined, len(current.rows))
        ended = [self._cancelled(t) for t in transition.cancelled] + [self._finished(t) for t in transition.finished]
        failed = [self._admit(a, agreed.cached[i]) for i, a in enumerate(pending[: len(transition.newcomers)])]
        ended += [f for f in failed if f is not None]
        self.composition = transition.composition.without([f.task_id for f in failed if f is not None])
        return StepResult(len(transition.newcomers), ended)

    def _propose(self, pending: Sequence[Admission]) -> list[int]:
        """This rank's cached-prefix length for each of the first pending assignments. Looked up once
        and held until admission, so what this rank proposed is still there when the batch agrees."""
        proposals = []
        for admission in pending[: self.max_batch]:
            if admission.task_id not in self.held:
                request = admission.request
                found = None if request is None else self.prefixes.longest(request.prompt_token_ids)
                self.held[admission.task_id] = found
            match = self.held[admission.task_id]
            proposals.append(0 if match is None else match.length)
        return proposals

    def _remember(self, rows: tuple[str, ...], kept_rows: tuple[int, ...]) -> None:
        """Copy every decoding row that leaves (finished or cancelled) into the prefix cache, keyed by
        the tokens it holds KV for: the prompt and every agreed token but the last (never fed)."""
        if self.cache is None or not self.prefixes.enabled:
            return
        for row, task_id in enumerate(rows):
            if row in kept_rows:
                continue
            stream = self.streams[task_id]
            tokens = [*stream.request.prompt_token_ids, *stream.fed[:-1]]
            snapshot = self.cache.snapshot(row)
            if snapshot is not None and snapshot[0][0].offset == len(tokens):
                self.prefixes.insert(tokens, *snapshot)

    def _reshape_cache(self, kept_rows: tuple[int, ...], joined: str | None, old_rows: int) -> None:
        if self.cache is not None and len(kept_rows) < old_rows:
            if kept_rows:
                self.cache.keep(kept_rows)
            else:
                self.cache = None
        if joined is not None:
            stream = self.streams[joined]
            stream.next_input = stream.request.prompt_token_ids[-1]
            if self.cache is None:
                self.cache = BatchShardCache(stream.run.caches)
            else:
                self.cache.join(stream.run.caches)

    def _cancelled(self, task_id: str) -> Ended:
        stream = self.streams[task_id]
        if stream.prefilled and task_id in self.composition.rows:
            stream.emitter.cancelled(stream.decode_step - 1)  # the step whose agreement stopped it
        else:
            stream.run.cancelled_at = f"prefill:{stream.next_chunk}"
        return self._end(stream, "cancelled")

    def _finished(self, task_id: str) -> Ended:
        stream = self.streams[task_id]
        stream.emitter.finish()
        return self._end(stream, stream.emitter.result.finish_reason)

    def _end(self, stream: _Stream, finish_reason: Any) -> Ended:
        del self.streams[stream.request.task_id]
        result, run = stream.emitter.result, stream.run
        if run.callback_errors:
            first = run.callback_errors[0]
            return Ended(run.task_id, None, f"the sink or cancel source failed: {type(first).__name__}: {first}")
        outcome = outcome_of(
            stream.request, run, "sequential", finish_reason, result.token_ids, result.text,
            len(stream.chunks), stream.started, result.first_token_at, stream.cached,
        )  # fmt: skip
        return Ended(run.task_id, outcome)

    def _admit(self, admission: Admission, cached: int) -> Ended | None:
        """A newcomer's stream, or why it fails alone (the same verdict on every rank); it reuses the
        agreed `cached` prompt tokens, cut from the entry this rank held for it."""
        match = self.held.pop(admission.task_id, None)
        if cached > (0 if match is None else match.length):
            raise RuntimeError(f"internal error: agreed to reuse {cached} tokens, this rank proposed fewer")
        request = admission.request
        if request is None:
            return Ended(admission.task_id, None, admission.error or "no request")
        try:
            self.engine.validate(request)
        except RequestError as exc:
            return Ended(admission.task_id, None, str(exc))
        engine = self.engine
        prompt_len = len(request.prompt_token_ids)
        step = effective_step(engine.settings.prefill_step_size, engine.collectives.world)
        chunks = chunk_sizes(prompt_len - cached, step)
        run = engine.task_run(request.task_id, admission.cancel, admission.sink, self.phases)
        if match is not None and cached:
            run.caches.replace_owned(prefix_caches(match.value, cached))
        spec = engine.decode_spec(request, len(chunks))
        emitter = Emitter(run, spec, engine.tokenizer)
        stream = _Stream(request, run, spec, emitter, chunks, time.perf_counter(), cached=cached)
        self.streams[request.task_id] = stream
        sink = admission.sink
        run.notify(sink.prefill_started, request.task_id, "sequential", prompt_len, len(chunks), step, cached)
        run.report_progress(cached, prompt_len, 0)
        return None
