"""A newcomer's prompt beside decoding rows leaves room for their decode (`pace.py`), on real ring
groups of 1 and 2 ranks (tiny model): rank 0 measures what a decode step costs against a chunk, the
step's all-reduce carries it, and every rank cuts the newcomer's prompt into the same shorter
chunks; its tokens are still those of the request served alone."""

from __future__ import annotations

import functools
import json
from itertools import pairwise
from typing import Any

import pytest

from runner.engine.plan import balanced_chunk_sizes, effective_step, model_keys_per_token
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny
from tests.runner.harness import run_tiny_group

pytestmark = pytest.mark.timeout(300)
STEP = 64
NEWCOMER = 300


def req(task_id: str, length: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": synthetic_prompt(length), "max_tokens": max_tokens, **extra}


def beside_rows(warm_pace: bool = False) -> dict[str, Any]:
    """Three rows decode (their steps teach the decode's cost), then the newcomer joins."""
    return {
        "kind": "batch",
        "max_batch": 4,
        "warm_pace": warm_pace,
        "tasks": [
            *({"request": req(f"row{k}", 5 + k, 40), "at": 0} for k in range(3)),
            {"request": req("newcomer", NEWCOMER, 4), "at": 8},
        ],
    }


def run_job(world: int, tasks: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return run_tiny_group(world, tasks, {"prefill_step_size": STEP})


@functools.cache
def results(world: int) -> list[list[dict[str, Any]]]:
    teach = {  # a long prompt alone: its chunks' steps teach rank 0 what a unit of chunk cost takes
        "kind": "batch",
        "max_batch": 4,
        "tasks": [{"request": req("teach", NEWCOMER + 7, 2, prefill_path="sequential"), "at": 0}],
    }
    return run_job(world, [teach, beside_rows(), {"request": req("newcomer", NEWCOMER, 4)}])  # the last: alone


def chunks(progress: list[list[int]]) -> list[int]:
    return [b[0] - a[0] for a, b in pairwise(progress[:-1])]


@pytest.mark.parametrize("world", (1, 2))
def test_the_newcomer_beside_rows_takes_shorter_chunks_cut_alike_on_every_rank(world: int) -> None:
    keys = model_keys_per_token(json.loads((cached_tiny() / "config.json").read_text()))
    full = balanced_chunk_sizes(NEWCOMER, effective_step(STEP, world), 0, keys)
    views = [rank_results[1]["ended"]["newcomer"] for rank_results in results(world)]
    assert all(view["progress"] == views[0]["progress"] for view in views)
    sizes = chunks(views[0]["progress"])
    assert sum(sizes) == NEWCOMER - 1
    assert sizes[0] < full[0] and len(sizes) > len(full), (sizes, full)  # room left for the rows' decode
    alone = results(world)[-1][2]
    assert views[-1]["token_ids"] == alone["token_ids"]  # the sampling rank's tokens


@pytest.mark.parametrize("world", (1, 2))
def test_a_prompt_alone_takes_full_chunks(world: int) -> None:
    """Nothing decodes beside it: no room to leave (the chunks are cut at full cost)."""
    keys = model_keys_per_token(json.loads((cached_tiny() / "config.json").read_text()))
    teach = results(world)[0][0]["ended"]["teach"]
    assert chunks(teach["progress"]) == balanced_chunk_sizes(NEWCOMER + 7, effective_step(STEP, world), 0, keys)


@pytest.mark.parametrize("world", (1, 2))
def test_a_batch_warmed_before_serving_leaves_room_for_its_first_newcomer(world: int) -> None:
    """The service teaches a batch its pace before the first user (`batch_warmup.warm_pace`): the
    first long prompt beside decoding rows, with no long prompt seen before, is already cut
    shorter, alike on every rank, and its tokens are the request's alone; the warm-up's own
    requests leave nothing behind. Without it the same schedule's newcomer takes full chunks."""
    keys = model_keys_per_token(json.loads((cached_tiny() / "config.json").read_text()))
    full = balanced_chunk_sizes(NEWCOMER, effective_step(STEP, world), 0, keys)
    views = [rank_results[0]["ended"]["newcomer"] for rank_results in warmed_results(world, warm=True)]
    assert all(view["progress"] == views[0]["progress"] for view in views)
    sizes = chunks(views[0]["progress"])
    assert sum(sizes) == NEWCOMER - 1 and len(sizes) > len(full), (sizes, full)
    assert views[-1]["token_ids"] == results(world)[-1][2]["token_ids"]
    cold = warmed_results(world, warm=False)[0][0]["ended"]["newcomer"]
    assert chunks(cold["progress"]) == full


@pytest.mark.parametrize("world", (1, 2))
def test_the_ranks_measure_the_chunks_rate_before_serving_and_agree_on_it(world: int) -> None:
    """Warmed as the service warms it, a batch cuts prompts at the rate its ranks measured on their
    own layers (`Engine.calibrate_prefill`): one value on every rank, near the priced one, and a
    prompt alone then takes exactly the chunks that rate balances; unwarmed, the priced rate."""
    priced = model_keys_per_token(json.loads((cached_tiny() / "config.json").read_text()))
    assert priced is not None
    rates = {rank_results[0]["keys_per_token"] for rank_results in warmed_results(world, warm=True)}
    assert len(rates) == 1, rates
    (measured,) = rates
    assert measured != priced and priced / 8 <= measured <= priced * 8
    assert {rank_results[0]["keys_per_token"] for rank_results in warmed_results(world, warm=False)} == {priced}
    alone = run_job(
        world,
        [
            {
                **beside_rows(warm_pace=True),
                "tasks": [{"request": req("alone", NEWCOMER, 2, prefill_path="sequential"), "at": 0}],
            }
        ],
    )
    view = alone[0][0]
    assert chunks(view["ended"]["alone"]["progress"]) == balanced_chunk_sizes(
        NEWCOMER, effective_step(STEP, world), 0, view["keys_per_token"]
    )


@functools.cache
def warmed_results(world: int, warm: bool) -> list[list[dict[str, Any]]]:
    """A fresh instance (its pace unlearned), the newcomer beside rows, its batch warmed or not."""
    return run_job(world, [beside_rows(warm_pace=warm)])
