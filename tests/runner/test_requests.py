"""A rank's request is its task's `TaskParams` plus what only the rank knows (`GenerationRequest`):
every parameter the log carries reaches it without a copy by hand, and a job's unknown key is
refused rather than dropped."""

from __future__ import annotations

import msgspec
import pytest

from events.constraints import JsonSchema, ToolFunction
from events.task_params import TaskParams
from runner.engine.requests import GenerationRequest


def _every_field_set() -> TaskParams:
    """Params with every field away from its default, so a field the request lost would show."""
    return TaskParams(
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        min_p=0.05,
        top_k=40,
        seed=11,
        stop=["END"],
        stream_progress=True,
        logprobs=3,
        tools=[ToolFunction(name="f", parameters='{"type": "object"}')],
        constraint=JsonSchema(name="s", schema='{"type": "object"}'),
        frequency_penalty=0.25,
        presence_penalty=-0.5,
        logit_bias=[(1, 2.0)],
        keep_alive_seconds=30.0,
        enable_thinking=False,
        n=2,
    )


def test_every_task_param_reaches_the_request() -> None:
    params = _every_field_set()
    defaults = msgspec.structs.asdict(TaskParams())
    assert all(value != defaults[name] for name, value in msgspec.structs.asdict(params).items())
    request = GenerationRequest.of_task("t1", [1, 2, 3], params, owner="key-a")
    for name, value in msgspec.structs.asdict(params).items():
        assert getattr(request, name) == value, name
    assert (request.task_id, request.prompt_token_ids, request.cache_scope) == ("t1", [1, 2, 3], "key-a")
    assert request.prefill_path == "auto"


def test_a_job_request_with_an_unknown_key_is_refused() -> None:
    job = {"task_id": "t", "prompt_token_ids": [1], "max_tokens": 2, "top_logprobs": 2}  # the old name
    with pytest.raises(msgspec.ValidationError, match="top_logprobs"):
        msgspec.convert(job, GenerationRequest)
    del job["top_logprobs"]
    assert msgspec.convert({**job, "logprobs": 2}, GenerationRequest).logprobs == 2
