"""What a rank is asked and what it hands back: a task's request (`GenerationRequest`, built alike on
every rank from its `TaskCreated`), the checks every rank applies to it with the same verdict, and
its outcome (`GenerationOutcome`) with the figures the API reports. Pure: no MLX, no collective."""

from __future__ import annotations

import time

import msgspec

from events.task_params import TaskParams
from events.vocabulary import FinishReason, PrefillPath
from runner.engine.plan import PathChoice
from runner.engine.sampling import Truncation
from runner.engine.task_run import TaskRun
from runner.errors import RequestError


class GenerationRequest(TaskParams, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A task's request on a rank: the client's parameters as the log carries them (`TaskParams`,
    inherited, so a field added there reaches the runner without a copy by hand) and what only the
    rank knows: the task, its prompt's token ids, whose prefix-cache entries it may use, the path a
    test or bench forces. A field not declared here or in `TaskParams` is refused (a test job's typo
    must not turn a check off). `TaskParams` fields the runner does not act on (`stream_progress`,
    `keep_alive_seconds`, `enable_thinking`: the API's, the master's and the chat template's) ride
    along unread."""

    task_id: str
    prompt_token_ids: list[int]
    prefill_path: PathChoice = "auto"  # benchmarks and tests force a path; services leave auto
    cache_scope: str = ""  # whose prefix-cache entries it may reuse and adds to: its owner's (`prefix_cache`)

    @classmethod
    def of_task(cls, task_id: str, prompt_token_ids: list[int], params: TaskParams, owner: str) -> GenerationRequest:
        """The request for a task of `params` created by `owner` (one API key's KV is never another's)."""
        return cls(
            **msgspec.structs.asdict(params), task_id=task_id, prompt_token_ids=prompt_token_ids, cache_scope=owner
        )


class ChoiceOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one of a task's several completions ended (choice 0's is the outcome's own fields)."""

    index: int
    finish_reason: FinishReason
    completion_tokens: int
    text: str
    stop_sequence: str | None = None


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
    # A task of n > 1 completions (`GenerationRequest.n`): each choice's end, by index; the fields
    # above are choice 0's, but `completion_tokens` counts every choice's. Empty for one completion.
    choices: list[ChoiceOutcome] = msgspec.field(default_factory=list)


def completion_room(max_tokens: int, prompt_len: int, context_length: int | None) -> int:
    """The tokens a request may generate: its `max_tokens`, cut where prompt and completion would
    pass the model's context (then it ends "length", as at `max_tokens`). At least one: a prompt
    that fills the context still gets the token its last position predicts. Every rank computes
    it from the same request and model, so the rows' stops stay agreed data."""
    if context_length is None:
        return max_tokens
    return max(1, min(max_tokens, context_length - prompt_len))


def check_request(request: GenerationRequest, context_length: int | None) -> None:
    """Bad input a user can cause, as one-line errors (same verdict on every rank)."""
    if not request.prompt_token_ids:
        raise RequestError("empty prompt: give at least one prompt token")
    if request.max_tokens <= 0:
        raise RequestError(f"max_tokens must be > 0, got {request.max_tokens}")
    if request.n < 1:
        raise RequestError(f"n must be >= 1, got {request.n}")
    if request.n > 1 and request.constraint is not None:
        raise RequestError(
            "n > 1 with a grammar (response_format json_schema, a forced tool call) is not supported: "
            "send one request per completion"
        )
    if context_length is not None and len(request.prompt_token_ids) > context_length:
        raise RequestError(
            f"prompt has {len(request.prompt_token_ids)} tokens but the model's context is {context_length}"
        )


def truncation_of(request: GenerationRequest) -> Truncation:
    return Truncation(top_p=request.top_p, min_p=request.min_p, top_k=request.top_k)


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
