"""A decoding stream's own rules: how it samples (`DecodeSpec`, `sample_token`) and what every rank
does with each agreed token (`Emitter`).

The batch's step (`batch.py`) hands every rank the same agreed token of each row; every rank then
applies the same stop rules (EOS, stop strings, max_tokens) to it, so all of them end a stream at
the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from events.logprobs import TokenLogprob
from events.vocabulary import FinishReason
from runner.engine.constraints import TokenMask
from runner.engine.logprobs import LazyLogprobs, as_token_logprob, token_logprobs
from runner.engine.sampling import LogitAdjustments, Sampler
from runner.engine.stops import TextAssembler
from runner.engine.task_run import TaskRun


@dataclass(slots=True)
class DecodeSpec:
    prompt_len: int
    max_tokens: int
    stop: list[str]
    sampler: Sampler
    eos_ids: frozenset[int]
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


class Emitter:
    """What a rank does with each agreed token: stop rules, text assembly, delivery. A token taken
    with `deliver=False` is held and goes out with the next delivered one (or at `finish`). Only
    the sampling rank streams text, so another rank detokenizes only a request with stop strings
    (every rank must see them alike to stop at the same token); else it keeps the token ids and
    their EOS and `max_tokens` rules, and its outcome's text is empty."""

    def __init__(self, run: TaskRun, spec: DecodeSpec, tokenizer: TokenizerWrapper) -> None:
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
        self.text_shown = False  # whether a delivery carried text (a reader has seen the stream begin)

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
            self.text_shown = self.text_shown or bool(text)
        if now and self.sampling and (text or ids):
            produced = len(self.result.token_ids)
            index = produced - len(ids)
            logprobs = self.logprobs[index:produced] if self.spec.top_logprobs is not None else None
            self.run.notify(self.run.sink.tokens, self.run.task_id, index, text, ids, logprobs)


def sample_token(logits: mx.array, spec: DecodeSpec) -> tuple[mx.array, LazyLogprobs | None]:
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
