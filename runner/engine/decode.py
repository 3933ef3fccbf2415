"""The decode loop: one token per step through every rank, no step left in flight.

Each step runs the shard on the previous token, the last rank samples, and one all-reduce of
[token, cancel vote] hands the token to every rank and agrees on stopping. Every rank then
applies the same stop rules (EOS, stop strings, max_tokens) to the same agreed tokens, so all
of them leave the loop at the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from events.logprobs import TokenLogprob
from events.vocabulary import FinishReason
from runner.engine.constraints import TokenMask
from runner.engine.logprobs import LazyLogprobs, as_token_logprob, token_logprobs
from runner.engine.sampling import LogitAdjustments
from runner.engine.stops import TextAssembler
from runner.engine.task_run import TaskRun


@dataclass(slots=True)
class DecodeSpec:
    first_input: int  # the last prompt token
    prompt_len: int
    max_tokens: int
    stop: list[str]
    sampler: Any
    eos_ids: frozenset[int]
    cancel_interval: int
    prefill_iterations: int
    top_logprobs: int | None = None  # logprobs with this many alternatives; None: not computed
    token_mask: TokenMask | None = None  # the request's grammar, on the sampling rank only
    adjustments: LogitAdjustments | None = None  # its penalties and logit_bias, on the sampling rank only


@dataclass(slots=True)
class DecodeResult:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason = "length"
    stop_sequence: str | None = None  # the request's stop string that ended it, if one did
    first_token_at: float | None = None  # perf_counter() when the first token was agreed
    steps: int = 0


def run_decode(run: TaskRun, spec: DecodeSpec, tokenizer: Any) -> DecodeResult:
    """The world size is agreed data: every rank takes the same loop. A grammar needs each token
    before it can mask the next, so one rank with a grammar steps without look-ahead."""
    if run.collectives.world == 1 and spec.token_mask is None:
        return _decode_alone(run, spec, tokenizer)
    return _decode_in_step(run, spec, tokenizer)


class Emitter:
    """What a rank does with each agreed token: stop rules, text assembly, delivery. A token taken
    with `deliver=False` is held and goes out with the next delivered one (or at `finish`). Only
    the sampling rank streams text, so another rank detokenizes only a request with stop strings
    (every rank must see them alike to stop at the same token); else it keeps the token ids and
    their EOS and `max_tokens` rules, and its outcome's text is empty."""

    def __init__(self, run: TaskRun, spec: DecodeSpec, tokenizer: Any) -> None:
        self.run, self.spec = run, spec
        self.result = DecodeResult()
        self.assembler = TextAssembler(stop=list(spec.stop))
        self.detokenizer = tokenizer.detokenizer
        self.detokenizer.reset()
        self.sampling = run.placement.is_last
        # the text: the sampling rank's to stream; a stop string's, every rank's to stop alike
        self.reads_text = self.sampling or bool(spec.stop)
        self.tokenizer = tokenizer
        self.logprobs: list[TokenLogprob] = []  # the sampling rank's, one per entry of result.token_ids
        self.held: tuple[str, list[int]] = ("", [])  # released by the assembler, not delivered yet
        self.delivered_at = 0.0  # perf_counter() at its last delivery

    def cancelled(self, step: int) -> DecodeResult:
        self.run.cancelled_at = f"decode:{step}"
        self.result.finish_reason = "cancelled"
        return self.finish()

    def accept(self, step: int, token: int, logprobs: LazyLogprobs | None = None, deliver: bool = True) -> bool:
        """Take the token agreed at `step`; True when generation stops here."""
        result, run = self.result, self.run
        result.steps = step + 1
        if step == 0:
            result.first_token_at = time.perf_counter()
            run.report_progress(self.spec.prompt_len, self.spec.prompt_len, self.spec.prefill_iterations)
        if self.spec.token_mask is not None:
            self.spec.token_mask.advance(token)
        if token in self.spec.eos_ids:
            result.finish_reason = "stop"
            return True
        result.token_ids.append(token)
        if logprobs is not None:
            self.logprobs.append(as_token_logprob(self.tokenizer, token, logprobs))
        if self.reads_text:
            self.detokenizer.add_token(token)
            self._deliver(self.assembler.add(token, self.detokenizer.last_segment), deliver)
            if self.assembler.stopped:
                result.finish_reason = "stop"
                result.stop_sequence = self.assembler.matched
                return True
        if step % 256 == 255:
            mx.clear_cache()
        return False

    def finish(self) -> DecodeResult:
        if not self.reads_text:
            return self.result
        self.detokenizer.finalize()
        flushed_text, flushed_ids = self.assembler.add(None, self.detokenizer.last_segment)  # bytes it still held
        rest_text, rest_ids = self.assembler.finish()
        self._deliver((flushed_text + rest_text, flushed_ids + rest_ids))
        self.result.text = self.assembler.text
        return self.result

    def _deliver(self, released: tuple[str, list[int]], now: bool = True) -> None:
        text, ids = self.held[0] + released[0], self.held[1] + released[1]
        self.held = ("", []) if now else (text, ids)
        if now:
            self.delivered_at = time.perf_counter()
        if now and self.sampling and (text or ids):
            produced = len(self.result.token_ids)
            index = produced - len(ids)
            logprobs = self.logprobs[index:produced] if self.spec.top_logprobs is not None else None
            self.run.notify(self.run.sink.tokens, self.run.task_id, index, text, ids, logprobs)


def _decode_in_step(run: TaskRun, spec: DecodeSpec, tokenizer: Any) -> DecodeResult:
    """Several ranks: one step at a time, each ending in the all-reduce of [token, stop vote]."""
    emitter = Emitter(run, spec, tokenizer)
    next_input = spec.first_input
    for step in range(spec.max_tokens):
        run.phases.enter("decode", run.task_id, step)
        local_token, logprobs = _step(run, next_input, spec)
        run.phases.enter("agree_cancel", run.task_id, step)
        poll = step % spec.cancel_interval == 0
        wants_stop = poll and run.wants_stop()
        token, stop_votes = run.collectives.agree([local_token if emitter.sampling else 0, int(wants_stop)])
        if stop_votes > 0:
            return emitter.cancelled(step)
        if emitter.accept(step, token, logprobs):
            break
        next_input = token
    return emitter.finish()


def _decode_alone(run: TaskRun, spec: DecodeSpec, tokenizer: Any) -> DecodeResult:
    """One rank: no collective to keep in step with, so, like mlx-lm, step n+1 is computed while
    token n is handled (the look-ahead crosses no collective: there is none). The step still in
    flight when decoding ends is waited for, so nothing is left running for the next task."""
    emitter = Emitter(run, spec, tokenizer)
    pending, pending_logprobs = _sample_lazily(run, mx.array([[spec.first_input]], dtype=mx.int32), spec)
    mx.async_eval(pending, *(pending_logprobs or ()))
    ahead: Any = None
    ahead_logprobs: LazyLogprobs | None = None
    try:
        for step in range(spec.max_tokens):
            run.phases.enter("decode", run.task_id, step)
            ahead, ahead_logprobs = None, None
            if step + 1 < spec.max_tokens:
                ahead, ahead_logprobs = _sample_lazily(run, pending.reshape(1, 1), spec)
                mx.async_eval(ahead, *(ahead_logprobs or ()))
            token = int(pending.item())
            if step % spec.cancel_interval == 0 and run.wants_stop():
                return emitter.cancelled(step)
            if emitter.accept(step, token, pending_logprobs):
                break
            pending, pending_logprobs = ahead, ahead_logprobs
        return emitter.finish()
    finally:
        if ahead is not None:
            mx.eval(ahead, *(ahead_logprobs or ()))


def _sample_lazily(run: TaskRun, tokens: Any, spec: DecodeSpec) -> tuple[Any, LazyLogprobs | None]:
    logits = run.forward(tokens)[:, -1, :]
    return sample_token(logits, spec)


def sample_token(logits: Any, spec: DecodeSpec) -> tuple[Any, LazyLogprobs | None]:
    """The sampled token and, when the request asks, its logprobs (lazily). They are of the
    distribution the sampler drew from: the model's, adjusted by the request's penalties and
    logit_bias, and under a grammar with the tokens it refuses at -inf, renormalized over the ones
    it allows (so a forced token has logprob 0)."""
    if spec.adjustments is not None:
        logits = spec.adjustments.apply(logits)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    if spec.token_mask is not None:
        logprobs = spec.token_mask.apply(logprobs)
    sampled = spec.sampler(logprobs)
    if spec.adjustments is not None:
        spec.adjustments.advance(sampled)
    if spec.top_logprobs is None:
        return sampled, None
    if spec.token_mask is not None:
        logprobs = logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)
    return sampled, token_logprobs(logprobs, sampled, spec.top_logprobs)


def _step(run: TaskRun, token: int, spec: DecodeSpec) -> tuple[int, LazyLogprobs | None]:
    """One forward step on this rank; the sampled token (and its logprobs, if asked) on the last
    rank, 0 elsewhere."""
    logits = run.forward(mx.array([[token]], dtype=mx.int32))
    if not run.placement.is_last:
        mx.eval([*run.caches.states(), *run.outbox.take_all()])
        return 0, None
    sampled, logprobs = sample_token(logits[:, -1, :], spec)
    mx.eval(sampled, *(logprobs or ()), *run.caches.states())
    return int(sampled.item()), logprobs
