"""Tasks of several completions (`GenerationRequest.n`) on real ring groups of 1 and 2 ranks (tiny
model): every rank admits the choices' rows together, the followers join from the leader's prompt
KV on each rank's own layers (no collective added: the group runs the schedule to its end, every
rank with the same steps and the same endings), and each choice's tokens are the same on 2 ranks as
on 1; a cancel ends every choice of its task, and the stream beside them is undisturbed."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from runner.local.local_run import synthetic_prompt
from tests.runner.harness import run_tiny_group, step_for

pytestmark = pytest.mark.timeout(300)


def req(task_id: str, length: int, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": synthetic_prompt(length), "max_tokens": max_tokens, **extra}


def schedule() -> dict[str, Any]:
    tasks = [
        {"request": req("bystander", 9, 24), "at": 0},
        {"request": req("sampled", 19, n=3, temperature=0.9, seed=4), "at": 2},  # chunks ride the rows' steps
        {"request": req("greedy", 13, n=2), "at": 3},
        {"request": req("cut", 11, 30, n=3, temperature=0.9), "at": 4, "cancel_at_step": 12},
    ]
    return {"kind": "batch", "name": "choices", "max_batch": 9, "tasks": tasks}


@functools.cache
def runs(world: int) -> list[dict[str, Any]]:
    """Per rank, the schedule's run."""
    ranks = run_tiny_group(world, [schedule()], {"prefill_step_size": step_for(world)})
    return [results[0] for results in ranks]


def choice_tokens(outcome: dict[str, Any], n: int) -> list[list[int]]:
    sink = outcome["sink"]
    first = [i for _, _, ids in sink["chunks"] for i in ids]
    return [first, *([i for c, _, _, ids in sink["choice_chunks"] if c == k for i in ids] for k in range(1, n))]


@pytest.mark.parametrize("world", [1, 2])
def test_every_rank_ends_every_task_once_at_the_same_step(world: int) -> None:
    rank_runs = runs(world)
    for run in rank_runs:
        assert set(run["ended"]) == {"bystander", "sampled", "greedy", "cut"}
        assert run["steps"] == rank_runs[0]["steps"]  # the same steps: the same collectives
        for task_id, outcome in run["ended"].items():
            assert outcome["timing"]["left_step"] == rank_runs[0]["ended"][task_id]["timing"]["left_step"]


@pytest.mark.parametrize("world", [2])
def test_each_choice_decodes_as_on_one_rank(world: int) -> None:
    alone, spread = runs(1)[-1]["ended"], runs(world)[-1]["ended"]  # the sampling rank's
    for task_id, n in (("sampled", 3), ("greedy", 2)):
        assert choice_tokens(spread[task_id], n) == choice_tokens(alone[task_id], n), task_id
    assert spread["bystander"]["token_ids"] == alone["bystander"]["token_ids"]


def test_choices_of_one_prompt() -> None:
    ended = runs(1)[-1]["ended"]
    sampled = choice_tokens(ended["sampled"], 3)
    assert len({tuple(t) for t in sampled}) == 3, sampled  # three seed streams, three samples
    greedy = choice_tokens(ended["greedy"], 2)
    assert greedy[0] == greedy[1]
    outcome = ended["sampled"]
    assert outcome["completion_tokens"] == sum(len(t) for t in sampled)
    assert [c["index"] for c in outcome["choices"]] == [0, 1, 2]
    assert len(outcome["sink"]["started"]) == 1  # one prefill reported, for the task


def test_a_cancel_ends_every_choice() -> None:
    cut = runs(2)[-1]["ended"]["cut"]
    assert cut["finish_reason"] == "cancelled"
    assert [c["finish_reason"] for c in cut["choices"]] == ["cancelled"] * 3
