"""A request whose `max_tokens` would run past the model's context ends "length" at the context,
on every rank, alone and in a batch (the cut is computed from the request and the model, the
same on every rank), instead of decoding positions the model was never trained on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from runner.engine.requests import completion_room
from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from runner.models.tiny import cached_tiny

CONTEXT = 48


@pytest.mark.parametrize(
    ("max_tokens", "prompt_len", "context", "room"),
    [
        (50, 30, 48, 18),  # cut at the context
        (5, 30, 48, 5),  # inside it: as asked
        (50, 48, 48, 1),  # a prompt that fills it still gets the token its last position predicts
        (50, 30, None, 50),  # a model that does not say
    ],
)
def test_the_room_is_max_tokens_cut_at_the_context(
    max_tokens: int, prompt_len: int, context: int | None, room: int
) -> None:
    assert completion_room(max_tokens, prompt_len, context) == room


def _short_context_model(tmp_path: Path) -> Path:
    model = tmp_path / "tiny-short"
    shutil.copytree(cached_tiny(), model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = CONTEXT
    config["eos_token_id"] = []  # random weights: never let an end token cut the stream first
    (model / "config.json").write_text(json.dumps(config))
    return model


def _request(task_id: str, prompt_len: int) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": synthetic_prompt(prompt_len), "max_tokens": 100}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", (1, 2))
def test_max_tokens_past_the_context_ends_length_at_the_context(tmp_path: Path, world: int) -> None:
    lengths = {"alone": 30, "in-batch-a": 40, "in-batch-b": 20}
    job = {
        "model_dir": str(_short_context_model(tmp_path)),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": [[0, 8]] if world == 1 else [[0, 4], [4, 8]],
        "settings": {"prefill_step_size": 16},
        "warmup": False,
        "tasks": [
            {"request": _request("alone", lengths["alone"])},
            {
                "kind": "batch",
                "max_batch": 4,
                "role": "b",
                "tasks": [{"request": _request(t, lengths[t]), "at": 0} for t in ("in-batch-a", "in-batch-b")],
            },
        ],
    }
    for rank in run_group(job, world, deadline_s=150):
        assert "results" in rank, rank
        alone = next(r for r in rank["results"] if r.get("task_id") == "alone")
        batch = next(r for r in rank["results"] if r.get("kind") == "batch")["ended"]
        for task_id, outcome in [("alone", alone), *batch.items()]:
            assert len(outcome["token_ids"]) == CONTEXT - lengths[task_id], (rank, task_id)
            assert outcome["finish_reason"] == "length", (rank, task_id)
