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

from runner.engine.plan import balanced_chunk_sizes, effective_step, even_split, model_keys_per_token
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny

pytestmark = pytest.mark.timeout(300)
STEP = 64
NEWCOMER = 300


def req(task_id: str, length: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": synthetic_prompt(length), "max_tokens": max_tokens, **extra}


@functools.cache
def results(world: int) -> list[list[dict[str, Any]]]:
    teach = {  # a long prompt alone: its chunks' steps teach rank 0 what a unit of chunk cost takes
        "kind": "batch", "max_batch": 4,
        "tasks": [{"request": req("teach", NEWCOMER + 7, 2, prefill_path="sequential"), "at": 0}],
    }  # fmt: skip
    beside = {  # three rows decode (their steps teach the decode's cost), then the newcomer joins
        "kind": "batch", "max_batch": 4,
        "tasks": [
            *({"request": req(f"row{k}", 5 + k, 40), "at": 0} for k in range(3)),
            {"request": req("newcomer", NEWCOMER, 4), "at": 8},
        ],
    }  # fmt: skip
    job = {
        "model_dir": str(cached_tiny()),
        "layer_ranges": even_split(8, world),
        "settings": {"prefill_step_size": STEP},
        "warmup": True,
        "tasks": [teach, beside, {"request": req("newcomer", NEWCOMER, 4)}],  # the last: alone, one task
    }
    ranks = run_group(job, world, deadline_s=200)
    for rank in ranks:
        assert "results" in rank, rank
    return [rank["results"] for rank in ranks]


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
