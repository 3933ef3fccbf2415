"""What one generation ended with: its tokens and text, how it finished, and its rates (pure: the
engine and the batch build one per task from their own decode state)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from events.vocabulary import FinishReason, PrefillPath
from runner.engine.task_run import TaskRun

if TYPE_CHECKING:  # the engine imports this module
    from runner.engine.engine import GenerationRequest


class GenerationOutcome(msgspec.Struct, kw_only=True):
    task_id: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]
    text: str
    path: PrefillPath
    ttft_ms: float | None
    prefill_tps: float | None
    decode_tps: float | None
    prefill_iterations: int
    cancelled_at: str | None  # "prefill:<iteration>" or "decode:<step>": where the ranks agreed to stop
    progress: list[tuple[int, int]]
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache, not prefilled
    stop_sequence: str | None = None  # the request's stop string that ended it, if one did


def outcome_of(
    request: GenerationRequest,
    run: TaskRun,
    path: PrefillPath,
    finish_reason: FinishReason,
    token_ids: list[int],
    text: str,
    prefill_iterations: int,
    started: float,
    first_token_at: float | None,
    cached_tokens: int = 0,
    *,
    stop_sequence: str | None = None,
) -> GenerationOutcome:
    now = time.perf_counter()
    ttft = None if first_token_at is None else first_token_at - started
    decode_time = None if first_token_at is None else now - first_token_at
    prompt_len = len(request.prompt_token_ids)
    return GenerationOutcome(
        task_id=request.task_id,
        finish_reason=finish_reason,
        prompt_tokens=prompt_len,
        completion_tokens=len(token_ids),
        token_ids=token_ids,
        text=text,
        path=path,
        ttft_ms=None if ttft is None else ttft * 1000,
        prefill_tps=None if not ttft else (prompt_len - cached_tokens) / ttft,
        decode_tps=(len(token_ids) - 1) / decode_time if decode_time and len(token_ids) > 1 else None,
        prefill_iterations=prefill_iterations,
        cancelled_at=run.cancelled_at,
        progress=list(run.progress),
        cached_tokens=cached_tokens,
        stop_sequence=stop_sequence,
    )
