"""Admission by KV memory on real ring groups of 1 and 2 ranks (tiny model): with `kv_cache_bytes`
holding two requests' reservations, the batch runs two at a time and the others wait their turn;
a request that could never fit fails alone with an error saying what to change, on every rank
alike; every served stream's tokens are the request's served alone."""

from __future__ import annotations

import functools
import json
import random
from typing import Any

import pytest

from runner.engine.kv_budget import batch_need
from runner.engine.plan import even_split
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny

pytestmark = pytest.mark.timeout(300)
PROMPT, MAX_TOKENS = 20, 30  # a reservation of 50 positions
CAPACITY = 120  # two reservations fit (100), three do not (150)
FITTING = ("a", "b", "c", "d")


def req(task_id: str, length: int, max_tokens: int) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": synthetic_prompt(length + len(task_id)), "max_tokens": max_tokens}


def kv_bytes_per_layer_token() -> int:
    config = json.loads((cached_tiny() / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_key_value_heads"] * head_dim * 4  # keys and values, float32


def group_results(job: dict[str, Any], world: int, deadline_s: float) -> list[list[dict[str, Any]]]:
    """Each rank's results of `job` (every rank must have finished it)."""
    ranks = run_group(job, world, deadline_s)
    for rank in ranks:
        assert "results" in rank, rank
    return [rank["results"] for rank in ranks]


@functools.cache
def results(world: int) -> list[list[dict[str, Any]]]:
    ranges = even_split(8, world)
    most_layers = max(end - start for start, end in ranges)
    requests = {t: req(t, PROMPT - len(t), MAX_TOKENS) for t in FITTING}
    huge = req("huge", 6, 200)  # 210 positions (its prompt is 10): more than the instance holds
    batch = {
        "kind": "batch",
        "max_batch": 8,
        "tasks": [{"request": r, "at": 0} for r in (requests["a"], requests["b"], huge, requests["c"], requests["d"])],
    }
    job = {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": ranges,
        "settings": {"kv_cache_bytes": CAPACITY * most_layers * kv_bytes_per_layer_token()},
        "warmup": True,
        "tasks": [batch, *({"request": requests[t]} for t in FITTING)],  # then each alone
    }
    return group_results(job, world, deadline_s=200)


@pytest.mark.parametrize("world", (1, 2))
def test_the_batch_runs_what_its_kv_holds_and_the_rest_wait_their_turn(world: int) -> None:
    ranks = results(world)
    views = [rank[0]["ended"] for rank in ranks]
    spans = {t: (views[0][t]["timing"]["admitted_step"], views[0][t]["timing"]["left_step"]) for t in FITTING}
    for step in range(max(end for _, end in spans.values()) + 1):
        running = [t for t, (start, end) in spans.items() if start <= step < end]
        assert len(running) <= 2, (step, spans)
    assert spans["c"][0] >= min(spans["a"][1], spans["b"][1])  # admitted once a stream left
    for view in views:  # every rank admitted at the same steps
        assert {t: view[t]["timing"]["admitted_step"] for t in FITTING} == {t: s for t, (s, _) in spans.items()}
    for k, task in enumerate(FITTING):  # the sampling rank's tokens, against the request alone
        assert views[-1][task]["token_ids"] == ranks[-1][1 + k]["token_ids"], task


@pytest.mark.parametrize("world", (1, 2))
def test_a_request_that_cannot_fit_alone_fails_saying_what_to_change(world: int) -> None:
    errors = {rank[0]["ended"]["huge"].get("error") for rank in results(world)}
    assert len(errors) == 1
    error = errors.pop()
    assert error is not None and "210" in error and str(CAPACITY) in error and "kv_cache_bytes" in error
    admitted = [rank[0]["ended"]["huge"]["timing"]["admitted_step"] for rank in results(world)]
    assert admitted == [0] * world  # it did not wait behind the others, nor block them


RANDOM_CAPACITY = 90  # positions on the rank with the most layers: two or three of the random requests at once


def random_schedule(seed: int) -> dict[str, Any]:
    """Joins, lags (ranks read the log at different times) and cancels, under a tight KV budget."""
    rng = random.Random(seed)
    tasks, at = [], 0
    for n in range(rng.randint(4, 7)):
        at += rng.randint(0, 3)
        entry: dict[str, Any] = {
            "request": req(f"k{seed}-{n}", rng.randint(1, 25), rng.randint(2, 20)),
            "at": at + rng.choice((0, 0.5)),
            "lag": {str(r): rng.randint(0, 3) for r in range(3)},
        }
        if rng.random() < 0.25:
            entry |= {"cancel_rank": rng.randrange(3), "cancel_at_poll": rng.randint(0, 10)}
        tasks.append(entry)
    return {"kind": "batch", "name": f"kv{seed}", "max_batch": rng.randint(2, 6), "tasks": tasks}


@functools.cache
def random_results(world: int) -> list[list[dict[str, Any]]]:
    schedules = [random_schedule(seed) for seed in range(4)]
    for schedule in schedules:
        for entry in schedule["tasks"]:
            if "cancel_rank" in entry:
                entry["cancel_rank"] %= world
    ranges = even_split(8, world)  # on 3 ranks 3, 3 and 2 layers: the ranks' capacities differ (90, 90, 135)
    most_layers = max(end - start for start, end in ranges)
    tasks: list[dict[str, Any]] = list(schedules)
    if world == 1:
        tasks += [{"request": entry["request"]} for schedule in schedules for entry in schedule["tasks"]]
    job = {
        "model_dir": str(cached_tiny()),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": ranges,
        "settings": {
            "kv_cache_bytes": RANDOM_CAPACITY * most_layers * kv_bytes_per_layer_token(),
            "prefill_step_size": 16,
        },
        "warmup": True,
        "tasks": tasks,
    }
    return group_results(job, world, deadline_s=250)


@pytest.mark.parametrize("world", (1, 2, 3))
def test_random_schedules_admit_alike_on_every_rank_within_the_kv_and_equal_the_requests_alone(world: int) -> None:
    alone = {r["task_id"]: r for r in random_results(1)[0] if r.get("kind") != "batch"}
    ranks = random_results(world)
    held_back = 0
    for index in range(4):
        runs = [rank[index]["ended"] for rank in ranks]
        admitted = [{t: e["timing"]["admitted_step"] for t, e in run.items()} for run in runs]
        assert all(view == admitted[0] for view in admitted), (world, index)
        served = {t: e for t, e in runs[-1].items() if "error" not in e}
        spans = {t: (e["timing"]["admitted_step"], e["timing"]["left_step"]) for t, e in served.items()}
        requests = {e["request"]["task_id"]: e["request"] for e in random_schedule(index)["tasks"]}
        needs = {t: len(r["prompt_token_ids"]) + r["max_tokens"] for t, r in requests.items()}
        assert max(needs.values()) <= RANDOM_CAPACITY  # none fails: every one waits its turn
        for step in range(max((end for _, end in spans.values()), default=0) + 1):
            running = [t for t, (start, end) in spans.items() if start <= step < end]
            assert batch_need([needs[t] for t in running]) <= RANDOM_CAPACITY, (world, index, step, spans)
        held_back += kv_waits(random_schedule(index), spans, world)
        for task_id, got in served.items():
            expected = alone[task_id]["token_ids"]
            if got["finish_reason"] == "cancelled":
                assert got["token_ids"] == expected[: len(got["token_ids"])], task_id
            else:
                assert got["token_ids"] == expected, task_id
    assert held_back > 0  # the bound binds: some request waited for KV with room in the batch


def kv_waits(schedule: dict[str, Any], spans: dict[str, tuple[int, int]], world: int) -> int:
    """Steps at which a request every rank held waited with fewer than `max_batch` members: for KV."""
    waits = 0
    for entry in schedule["tasks"]:
        task_id = entry["request"]["task_id"]
        if task_id not in spans:
            continue
        held_from = max(entry["at"] + entry["lag"][str(r)] for r in range(world))
        for step in range(int(held_from) + 1, spans[task_id][0]):
            members = sum(1 for start, end in spans.values() if start <= step < end)
            waits += members < schedule["max_batch"]
    return waits
