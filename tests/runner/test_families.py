"""Other mlx-lm families shard correctly: qwen2 (PipelineMixin, `layers` is a slice), qwen3,
mistral, and gemma3 (sliding-window rotating caches whose mask source another rank owns)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.local.launch import run_group
from runner.local.local_run import synthetic_prompt
from tests.runner.families import FAMILY_CONFIGS, make_family_model

pytestmark = pytest.mark.timeout(120)
LENGTHS = (1, 9, 20)  # with chunks of 6: sequential, then pipeline over 2 and 4 chunks
CHUNK = 6


def one_rank_tokens(model_dir: Path, length: int) -> list[int]:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    model, tokenizer = load(str(model_dir))
    prompt = mx.array(synthetic_prompt(length))
    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=6, prefill_step_size=CHUNK)]


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_two_ranks_match_mlx_lm_one_rank(family: str, tmp_path: Path) -> None:
    model_dir = make_family_model(tmp_path / family, family)
    n = FAMILY_CONFIGS[family]["num_hidden_layers"]
    tasks = [
        {
            "request": {
                "task_id": f"{length}-{path}",
                "prompt_token_ids": synthetic_prompt(length),
                "max_tokens": 6,
                "prefill_path": path,
            }
        }
        for length in LENGTHS
        for path in ("auto", "sequential")
    ]
    job = {
        "model_dir": str(model_dir),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": [[0, n // 2], [n // 2, n]],
        "settings": {"prefill_step_size": 2 * CHUNK},
        "warmup": False,
        "tasks": tasks,
    }
    results = run_group(job, 2, deadline_s=90)
    for length in LENGTHS:
        expected = one_rank_tokens(model_dir, length)
        for rank_result in results:
            outcomes = {o["task_id"]: o for o in rank_result["results"]}
            assert outcomes[f"{length}-auto"]["token_ids"] == expected, (family, length)
            assert outcomes[f"{length}-sequential"]["token_ids"] == expected, (family, length)
            assert outcomes[f"{length}-auto"]["path"] == ("sequential" if length <= CHUNK + 1 else "pipeline")
