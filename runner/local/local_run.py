"""Turning `shoal generate` options into a checked job for a local group (no MLX here).

Everything a user can get wrong is checked here, before any rank process starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from events.runner_settings import RunnerSettings
from events.task_params import TaskParams
from runner.engine.plan import even_split, split_from_counts
from runner.errors import RequestError, SplitError
from runner.models.model_info import ModelInfo, read_model_info

RUNNER_DEFAULTS = RunnerSettings()  # a local group runs with the cluster's defaults


@dataclass(slots=True)
class LocalRunSpec:
    model: str  # a directory or "tiny"
    ranks: int
    split: list[int] | None = None
    prompt: str | None = None
    prompt_tokens: int | None = None
    params: TaskParams = field(default_factory=TaskParams)  # the sampling options, as a served task's
    prefill_step: int = RUNNER_DEFAULTS.prefill_step_size
    kv_bits: int | None = RUNNER_DEFAULTS.kv_bits
    cancel_at_iteration: int | None = None
    cancel_rank: int = 0
    warmup: bool = True


def synthetic_prompt(count: int) -> list[int]:
    """`--prompt-tokens K`: a fixed, varied run of ordinary (non-special) token ids."""
    return [(i * 37 + 11) % 200 + 32 for i in range(count)]


def encode_text_prompt(model_dir: Path, text: str) -> list[int]:
    # transformers warns on stderr that PyTorch is absent; only its tokenizers are used here.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer  # lazy: slow import, only for --prompt

    from runner.models.chat import encode_chat

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return encode_chat(tokenizer, [{"role": "user", "content": text}])


def layer_ranges(info: ModelInfo, ranks: int, split: list[int] | None) -> list[tuple[int, int]]:
    if ranks < 1:
        raise SplitError(f"--ranks must be >= 1, got {ranks}")
    if ranks > info.n_layers:
        raise SplitError(f"{ranks} ranks but the model has only {info.n_layers} layers; use at most {info.n_layers}")
    if split is None:
        return even_split(info.n_layers, ranks)
    if len(split) != ranks:
        raise SplitError(f"--split gives {len(split)} layer counts for {ranks} ranks")
    return split_from_counts(split, info.n_layers)


def build_job(spec: LocalRunSpec, model_dir: Path) -> dict[str, Any]:
    info = read_model_info(model_dir)
    ranges = layer_ranges(info, spec.ranks, spec.split)
    if spec.prompt is not None and spec.prompt_tokens is not None:
        raise RequestError("give either --prompt or --prompt-tokens, not both")
    if spec.prompt is not None:
        if not spec.prompt.strip():
            raise RequestError("empty prompt: --prompt needs some text")
        prompt_ids = encode_text_prompt(model_dir, spec.prompt)
    else:
        count = 16 if spec.prompt_tokens is None else spec.prompt_tokens
        if count <= 0:
            raise RequestError(f"empty prompt: --prompt-tokens must be > 0, got {count}")
        prompt_ids = synthetic_prompt(count)
    if spec.params.max_tokens <= 0:
        raise RequestError(f"--max-tokens must be > 0, got {spec.params.max_tokens}")
    if info.context_length is not None and len(prompt_ids) > info.context_length:
        raise RequestError(f"prompt has {len(prompt_ids)} tokens but the model's context is {info.context_length}")
    request = {"task_id": "generate", "prompt_token_ids": prompt_ids, **msgspec.to_builtins(spec.params)}
    task: dict[str, Any] = {"request": request}
    if spec.cancel_at_iteration is not None:
        task.update(cancel_rank=spec.cancel_rank, cancel_at_poll=spec.cancel_at_iteration)
    return {
        "model_dir": str(model_dir),
        "layer_ranges": ranges,
        "settings": msgspec.to_builtins(runner_settings(spec)),
        "warmup": spec.warmup,
        "tasks": [task],
    }


def runner_settings(spec: LocalRunSpec) -> RunnerSettings:
    """The cluster's defaults with the flags given."""
    given = {"prefill_step_size": spec.prefill_step, "kv_bits": spec.kv_bits}
    try:
        return msgspec.convert(given, RunnerSettings)  # checked here, before any rank starts
    except msgspec.ValidationError as exc:
        raise RequestError(f"invalid --prefill-step or --kv-bits: {exc}") from None


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One JSON object for `shoal generate --json`, from every rank's outcome of the one task (a
    request every rank refused fails alike on every rank: the first one's error says why)."""
    outcomes = [r["results"][0] for r in results]
    failed = next((o for o in outcomes if "error" in o), None)
    if failed is not None:
        raise RequestError(f"the request failed: {failed['error']}")
    sampler = outcomes[-1]
    return {
        "text": sampler["text"],
        "token_ids": sampler["token_ids"],
        "path": sampler["path"],
        "finish_reason": sampler["finish_reason"],
        "cancelled": sampler["finish_reason"] == "cancelled",
        "cancelled_at": [o["cancelled_at"] for o in outcomes],
        "prompt_tokens": sampler["prompt_tokens"],
        "completion_tokens": sampler["completion_tokens"],
        "progress": [o["progress"] for o in outcomes],
        "prefill_iterations": [o["prefill_iterations"] for o in outcomes],
        "ttft_ms": sampler["ttft_ms"],
        "prefill_tps": sampler["prefill_tps"],
        "decode_tps": sampler["decode_tps"],
    }
