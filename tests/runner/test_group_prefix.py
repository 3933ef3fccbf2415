"""The prefix cache on real ring groups of 1-3 ranks (tiny model): a conversation's next turn and a
branch of it reuse the KV of the earlier turn — fewer tokens prefilled, exactly the same greedy
tokens as with the cache off and as on one rank; the same turn from another API key reuses nothing
— and ranks whose caches differ (one rank's small bound evicted the entry) agree on the prefix and
still produce the same tokens."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from runner.engine.plan import even_split
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny
from tests.runner.harness import step_for

pytestmark = pytest.mark.timeout(300)
HISTORY = 40  # tokens of the first turn's prompt
FIRST_TOKENS = 8
LAYERS = 8
KV_BYTES_PER_TOKEN_LAYER = 2 * 2 * 64 * 4  # keys and values, 2 KV heads of 64 float32 (the tiny model)
OTHER_PROMPT = [(i * 53 + 5) % 200 + 32 for i in range(HISTORY)]  # shares no first token with the history
BRANCH = synthetic_prompt(HISTORY)[:30] + OTHER_PROMPT[:9]


def req(task_id: str, prompt: list[int], max_tokens: int = FIRST_TOKENS) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": prompt, "max_tokens": max_tokens}


def conversation(cache_on: bool) -> dict[str, Any]:
    tasks = [
        {"request": req("first", synthetic_prompt(HISTORY)), "at": 0},
        {"request": req("bystander", OTHER_PROMPT[:17], 30), "at": 2},  # rows of other lengths: padding
        {"request": req("second", OTHER_PROMPT[:5]), "at": 0, "after": "first"},
        {"request": req("branch", BRANCH), "at": 70},
        # the same next turn from another API key: it must not reuse (nor learn about) the history
        {"request": {**req("stranger", OTHER_PROMPT[:5]), "cache_scope": "another key"}, "at": 75, "after": "first"},
    ]
    bounds = {} if cache_on else {str(r): 0 for r in range(3)}
    # the first schedule of the group (cache on) is warmed as the service warms its batch before the
    # first user (`batch_warmup`: requests of its own, then the prefix cache emptied): the
    # conversation's turns must still find each other's KV
    return {
        "kind": "batch",
        "name": f"talk-{cache_on}",
        "max_batch": 4,
        "tasks": tasks,
        "prefix_cache_bytes": bounds,
        "warm_pace": cache_on,
    }


def entry_bytes(tokens: int, world: int, rank: int) -> int:
    start, end = even_split(LAYERS, world)[rank]
    return tokens * (end - start) * KV_BYTES_PER_TOKEN_LAYER


def eviction(world: int) -> dict[str, Any]:
    """The last rank's bound holds one finished task's KV: the second evicts the first there only."""
    last = world - 1
    tasks = [
        {"request": req("a", synthetic_prompt(HISTORY)), "at": 0},
        {"request": req("b", OTHER_PROMPT), "at": 30},
        {"request": req("c", [*synthetic_prompt(HISTORY)[:35], 40, 41, 42]), "at": 60},
    ]
    bound = entry_bytes(HISTORY + FIRST_TOKENS, world, last) * 3 // 2
    return {"kind": "batch", "name": "evict", "max_batch": 4, "tasks": tasks, "prefix_cache_bytes": {str(last): bound}}


@functools.cache
def runs(world: int) -> list[list[dict[str, Any]]]:
    """Per rank: the conversation with the cache, without it, and the eviction schedule."""
    job = {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": even_split(LAYERS, world),
        "settings": {"prefill_step_size": step_for(world)},
        "warmup": True,
        "tasks": [conversation(True), conversation(False), eviction(world)],
    }
    ranks = run_group(job, world, deadline_s=200)
    for rank in ranks:
        assert "results" in rank, rank
    return [rank["results"] for rank in ranks]


def tokens(run: dict[str, Any]) -> dict[str, list[int]]:
    return {task_id: outcome["token_ids"] for task_id, outcome in run["ended"].items()}


@pytest.mark.parametrize("world", (1, 2, 3))
def test_the_next_turn_reuses_the_history_and_generates_the_same_tokens(world: int) -> None:
    for rank, (warm, cold, _) in enumerate(runs(world)):
        where = f"world={world} rank={rank}"
        assert tokens(warm) == tokens(cold) == tokens(runs(1)[0][1]), where
        first, second, branch = (warm["ended"][t] for t in ("first", "second", "branch"))
        assert first["finish_reason"] == "length", where  # all its tokens, so its KV covers them all but the last...
        history = HISTORY + FIRST_TOKENS - (0 if world == 1 else 1)  # ...or all: one rank's look-ahead fed the last
        assert second["cached_tokens"] == history, where
        assert second["progress"][0] == [history, HISTORY + FIRST_TOKENS + 5], where
        assert second["sink"]["started"][0]["cached"] == history, where
        assert second["prefill_iterations"] < cold["ended"]["second"]["prefill_iterations"], where
        assert branch["cached_tokens"] == 30, where  # cut from a longer entry
        assert warm["ended"]["stranger"]["cached_tokens"] == 0, where  # another key's history
        assert cold["ended"]["second"]["cached_tokens"] == 0, where
        assert warm["prefix_cache"]["entries"] >= 1 and cold["prefix_cache"]["entries"] == 0, where


@pytest.mark.parametrize("world", (1, 2, 3))
def test_ranks_with_different_caches_agree_and_the_bound_holds(world: int) -> None:
    evicts = [rank_runs[2] for rank_runs in runs(world)]
    for rank, run in enumerate(evicts):
        where = f"world={world} rank={rank}"
        assert run["ended"]["c"]["cached_tokens"] == 0, where  # the last rank no longer holds "a"
        assert tokens(run) == tokens(evicts[0]), where
        assert run["prefix_cache"]["nbytes"] <= run["prefix_cache"]["bound"], where
    assert evicts[-1]["prefix_cache"]["entries"] == 1  # "b" evicted "a", then "c" evicted "b"
    if world > 1:
        assert evicts[0]["prefix_cache"]["entries"] == 3  # the other ranks kept all three
