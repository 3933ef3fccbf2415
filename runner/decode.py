"""The decode loop: one token per step through every rank, no step left in flight.

Each step runs the shard on the previous token, the last rank samples, and one all-reduce of
[token, cancel vote] hands the token to every rank and agrees on stopping. Every rank then
applies the same stop rules (EOS, stop strings, max_tokens) to the same agreed tokens, so all
of them leave the loop at the same step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx

from runner.stops import TextAssembler
from runner.task_run import TaskRun

FinishReason = Literal["stop", "length", "cancelled"]


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


@dataclass(slots=True)
class DecodeResult:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason = "length"
    first_token_at: float | None = None  # perf_counter() when the first token was agreed
    steps: int = 0


def run_decode(run: TaskRun, spec: DecodeSpec, tokenizer: Any) -> DecodeResult:
    result = DecodeResult()
    assembler = TextAssembler(stop=list(spec.stop))
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    sampling = run.placement.is_last
    next_input = spec.first_input
    for step in range(spec.max_tokens):
        run.phases.enter("decode", run.task_id, step)
        local_token = _step(run, next_input, spec.sampler)
        run.phases.enter("agree_cancel", run.task_id, step)
        poll = step % spec.cancel_interval == 0
        wants_stop = poll and run.wants_stop()
        token, stop_votes = run.collectives.agree([local_token if sampling else 0, int(wants_stop)])
        result.steps = step + 1
        if stop_votes > 0:
            run.cancelled_at = f"decode:{step}"
            result.finish_reason = "cancelled"
            break
        if step == 0:
            result.first_token_at = time.perf_counter()
            run.report_progress(spec.prompt_len, spec.prompt_len, spec.prefill_iterations)
        if token in spec.eos_ids:
            result.finish_reason = "stop"
            break
        result.token_ids.append(token)
        detokenizer.add_token(token)
        _deliver(run, sampling, assembler.add(token, detokenizer.last_segment), len(result.token_ids))
        if assembler.stopped:
            result.finish_reason = "stop"
            break
        next_input = token
        if step % 256 == 255:
            mx.clear_cache()
    detokenizer.finalize()
    flushed_text, flushed_ids = assembler.add(None, detokenizer.last_segment)  # bytes it still held
    rest_text, rest_ids = assembler.finish()
    _deliver(run, sampling, (flushed_text + rest_text, flushed_ids + rest_ids), len(result.token_ids))
    result.text = assembler.text
    return result


def _step(run: TaskRun, token: int, sampler: Any) -> int:
    """One forward step on this rank; the sampled token on the last rank, 0 elsewhere."""
    logits = run.forward(mx.array([[token]], dtype=mx.int32))
    if not run.placement.is_last:
        mx.eval([*run.caches.states(), *run.outbox.take_all()])
        return 0
    logits = logits[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sampled = sampler(logprobs)
    mx.eval(sampled, *run.caches.states())
    return int(sampled.item())


def _deliver(run: TaskRun, sampling: bool, released: tuple[str, list[int]], produced: int) -> None:
    text, ids = released
    if sampling and (text or ids):
        run.notify(run.sink.tokens, run.task_id, produced - len(ids), text, ids)
