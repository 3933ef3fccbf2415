"""OpenAI's logit adjustments (`logit_bias`, `presence_penalty`, `frequency_penalty`): the formula
on a few logits, then real ring groups of 1-3 ranks against a reference written here from OpenAI's
formula alone (the tiny model's full forward at each step, no cache, no engine): alone and in a
batch beside plain rows, greedy and seeded, every rank ending every request at the same token."""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.utils import load

from runner.engine.plan import even_split
from runner.engine.sampling import LogitAdjustments, check_adjustments, logit_adjustments
from runner.errors import RequestError
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny

pytestmark = pytest.mark.timeout(300)
MAX_TOKENS = 16
# Biases strong enough to lead the greedy choice, penalties that soon take the lead away again:
# the output moves between the biased tokens and the model's own as the counts grow.
ADJUSTED = {
    "bias-freq": {"logit_bias": [[42, 6.0], [99, 5.0]], "frequency_penalty": 1.5},
    "bias-pres": {"logit_bias": [[42, 6.0], [99, 5.0], [7, -100.0]], "presence_penalty": 2.0},
    "both": {"logit_bias": [[300, 4.0]], "frequency_penalty": 0.7, "presence_penalty": 1.1},
    "negative": {"logit_bias": [[42, 3.0]], "frequency_penalty": -2.0},  # a negative penalty favours repeats
}


def test_the_formula_on_a_few_logits() -> None:
    adjust = LogitAdjustments(0.5, 1.0, [(1, 2.0), (3, -1.0), (1, 1.0)])  # a repeated id adds up
    logits = mx.zeros((1, 4))
    assert adjust.apply(logits).tolist() == [[0.0, 3.0, 0.0, -1.0]]
    for token in (2, 2, 0):
        adjust.advance(mx.array([token]))
    # token 2 twice: 0.5 * 2 + 1.0; token 0 once: 0.5 + 1.0
    assert adjust.apply(logits).tolist() == [[-1.5, 3.0, -2.0, -1.0]]


def test_a_request_without_adjustments_gets_none() -> None:
    assert logit_adjustments(0.0, 0.0, []) is None
    assert logit_adjustments(0.0, 0.0, [(1, 0.5)]) is not None


@pytest.mark.parametrize(
    ("frequency", "presence", "bias", "says"),
    [
        (2.5, 0.0, [], "frequency_penalty must be between -2 and 2"),
        (0.0, float("nan"), [], "presence_penalty must be between -2 and 2"),
        (0.0, 0.0, [(1024, 1.0)], "outside the model's vocabulary of 1024"),
        (0.0, 0.0, [(-1, 1.0)], "outside the model's vocabulary"),
        (0.0, 0.0, [(3, 101.0)], "between -100 and 100"),
        (0.0, 0.0, [(i, 1.0) for i in range(301)], "over the limit of 300"),
    ],
)
def test_out_of_range_adjustments_are_request_errors(
    frequency: float, presence: float, bias: list[tuple[int, float]], says: str
) -> None:
    with pytest.raises(RequestError, match=says):
        check_adjustments(frequency, presence, bias, 1024)


@functools.cache
def reference(length: int, adjusted: str | None) -> list[int]:
    """Greedy tokens by OpenAI's formula: logits + bias - (frequency x count + presence x seen),
    for the synthetic prompt of `length` and the `ADJUSTED` entry named (None: no adjustment)."""
    model, _tokenizer = load(str(cached_tiny()))
    settings: dict[str, Any] = ADJUSTED[adjusted] if adjusted is not None else {}
    bias: dict[int, float] = {}
    for token, value in settings.get("logit_bias", []):
        bias[token] = bias.get(token, 0.0) + value
    counts: dict[int, int] = {}
    tokens, out = synthetic_prompt(length), []
    for _ in range(MAX_TOKENS):
        logits = np.array(model(mx.array([tokens]))[0, -1, :].astype(mx.float32))
        for token, value in bias.items():
            logits[token] += value
        for token, count in counts.items():
            logits[token] -= settings.get("frequency_penalty", 0.0) * count + settings.get("presence_penalty", 0.0)
        chosen = int(np.argmax(logits))
        out.append(chosen)
        counts[chosen] = counts.get(chosen, 0) + 1
        tokens.append(chosen)
    return out


def request(task_id: str, length: int, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": synthetic_prompt(length), "max_tokens": MAX_TOKENS, **extra}


def schedule() -> dict[str, Any]:
    """The adjusted requests in one batch with plain rows, joining at different steps."""
    tasks = [{"request": request("plain-a", 9), "at": 0}, {"request": request("plain-b", 4), "at": 1}]
    tasks += [{"request": request(name, 5 + i, **extra), "at": i} for i, (name, extra) in enumerate(ADJUSTED.items())]
    tasks.append({"request": request("seeded", 6, temperature=0.9, seed=3, **ADJUSTED["both"]), "at": 2})
    return {"kind": "batch", "name": "adjusted", "max_batch": 8, "tasks": tasks}


@functools.cache
def results(world: int) -> list[list[dict[str, Any]]]:
    """Per rank: the adjusted requests alone (the one-task path), then the batch."""
    alone = [{"request": request(name, 5 + i, **extra)} for i, (name, extra) in enumerate(ADJUSTED.items())]
    alone.append({"request": request("seeded", 6, temperature=0.9, seed=3, **ADJUSTED["both"])})
    job = {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": even_split(8, world),
        "settings": {},
        "tasks": [*alone, schedule()],
    }
    ranks = run_group(job, world, deadline_s=200)
    for rank in ranks:
        assert "results" in rank, rank
    return [rank["results"] for rank in ranks]


def outputs(world: int) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The sampling rank's tokens: alone, and in the batch."""
    last = results(world)[-1]
    alone = {r["task_id"]: r["token_ids"] for r in last if r.get("kind") != "batch"}
    batch = next(r for r in last if r.get("kind") == "batch")
    return alone, {task_id: ended["token_ids"] for task_id, ended in batch["ended"].items()}


@pytest.mark.parametrize("world", (1, 2, 3))
def test_adjusted_greedy_output_follows_openais_formula_alone_and_in_a_batch(world: int) -> None:
    alone, batched = outputs(world)
    for i, name in enumerate(ADJUSTED):
        assert alone[name] == reference(5 + i, name), name
        assert batched[name] == reference(5 + i, name), name
    assert batched["plain-a"] == reference(9, None)  # a neighbour's adjustments never touch another row
    assert all(reference(5 + i, name) != reference(5 + i, None) for i, name in enumerate(ADJUSTED))


@pytest.mark.parametrize("world", (2, 3))
def test_seeded_adjusted_sampling_is_the_same_on_every_world_and_in_a_batch(world: int) -> None:
    alone_one, batched_one = outputs(1)
    alone, batched = outputs(world)
    assert alone["seeded"] == alone_one["seeded"] == batched["seeded"] == batched_one["seeded"]


@pytest.mark.parametrize("world", (2, 3))
def test_every_rank_ends_every_adjusted_request_at_the_same_token(world: int) -> None:
    per_rank = [
        {r["task_id"]: r.get("completion_tokens") for r in rank if r.get("kind") != "batch"} for rank in results(world)
    ]
    assert all(table == per_rank[0] for table in per_rank)
