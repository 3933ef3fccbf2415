"""Small random models of other mlx-lm families, sharing the tiny model's tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

_COMMON: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-6,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}

FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2": {**_COMMON, "model_type": "qwen2", "num_hidden_layers": 4},
    "qwen3": {**_COMMON, "model_type": "qwen3", "num_hidden_layers": 4, "head_dim": 64},
    "mistral": {**_COMMON, "model_type": "mistral", "num_hidden_layers": 4},
    # Sliding-window layers (rotating caches, window smaller than the prompt) between global
    # ones: masks come from cache[0] and cache[pattern-1], which another rank may own.
    "gemma3_text": {
        **_COMMON,
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "head_dim": 64,
        "sliding_window": 8,
        "sliding_window_pattern": 3,
        "query_pre_attn_scalar": 64,
    },
}


def make_family_model(out_dir: Path, family: str) -> Path:
    from runner.models.tiny import cached_tiny, write_random_model

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(cached_tiny() / name, out_dir / name)
    config = {**FAMILY_CONFIGS[family], "eos_token_id": [1023]}
    return write_random_model(out_dir, config, seed=1)
