"""Logprobs from the sampling rank: OpenAI's invariants, and the same numbers on 1 and 2 ranks as
a plain 1-rank forward pass over the prompt and the generated tokens computes."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.utils import load

from runner.engine.plan import even_split
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny

pytestmark = pytest.mark.timeout(180)

PROMPT = synthetic_prompt(13)
TOP = 5


def _job(world: int) -> dict[str, Any]:
    greedy = {"task_id": "greedy", "prompt_token_ids": PROMPT, "max_tokens": 8, "logprobs": TOP}
    sampled = {**greedy, "task_id": "sampled", "temperature": 0.9, "seed": 3, "logprobs": 0}
    plain = {**greedy, "task_id": "plain", "logprobs": None}
    return {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": even_split(8, world),
        "settings": {"prefill_step_size": 6 * world},
        "warmup": False,
        "tasks": [{"request": greedy}, {"request": sampled}, {"request": plain}],
    }


def _reference(prompt: list[int], generated: list[int]) -> list[float]:
    """Each generated token's logprob from one forward pass of the whole model (no cache)."""
    model = load(str(cached_tiny()))[0]
    tokens = mx.array([prompt + generated[:-1]])
    logits = model(tokens)[0, len(prompt) - 1 :, :].astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return [logprobs[i, t].item() for i, t in enumerate(generated)]


@pytest.mark.parametrize("world", [1, 2])
def test_logprobs_match_a_one_rank_forward_pass(world: int) -> None:
    sampling_rank = run_group(_job(world), world, deadline_s=150)[-1]
    greedy, sampled, plain = sampling_rank["results"]
    logprobs = greedy["sink"]["logprobs"]
    assert [lp["token_id"] for lp in logprobs] == greedy["token_ids"]
    for lp in logprobs:
        tops = [t["logprob"] for t in lp["top"]]
        assert len(tops) == TOP
        assert tops == sorted(tops, reverse=True)
        assert all(v <= 0 for v in [lp["logprob"], *tops])
        assert lp["logprob"] == pytest.approx(tops[0], abs=1e-6)  # greedy: the chosen token is the most likely
        assert lp["top"][0]["token_id"] == lp["token_id"]
    reference = _reference(PROMPT, greedy["token_ids"])
    assert [lp["logprob"] for lp in logprobs] == pytest.approx(reference, abs=1e-3)
    assert [lp["token_id"] for lp in sampled["sink"]["logprobs"]] == sampled["token_ids"]
    assert all(lp["top"] == [] for lp in sampled["sink"]["logprobs"])
    assert sampled["sink"]["logprobs"] and all(lp["logprob"] <= 0 for lp in sampled["sink"]["logprobs"])
    assert plain["sink"]["logprobs"] == []
    assert plain["token_ids"] == greedy["token_ids"]
