"""What can be checked about a model directory without MLX, before any rank starts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from runner.errors import ModelDirError

_LAYER_COUNT_KEYS = ("num_hidden_layers", "n_layers", "num_layers", "n_layer")
_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "n_positions", "seq_length")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    path: Path
    model_type: str
    n_layers: int
    context_length: int | None


def read_model_info(model_dir: Path) -> ModelInfo:
    if not model_dir.exists():
        raise ModelDirError(f"model directory {model_dir} does not exist")
    if not model_dir.is_dir():
        raise ModelDirError(f"{model_dir} is not a directory")
    config = read_config(model_dir / "config.json")
    if not any(model_dir.glob("*.safetensors")):
        raise ModelDirError(f"{model_dir} is not an mlx-lm model: no *.safetensors weights")
    return ModelInfo(model_dir, str(config["model_type"]), layer_count(config, model_dir), context_length(config))


def read_config(config_path: Path) -> dict[str, object]:
    """An mlx-lm `config.json`, checked to name its model type."""
    model_dir = config_path.parent
    if not config_path.exists():
        raise ModelDirError(f"{model_dir} is not an mlx-lm model: no config.json")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ModelDirError(f"{config_path} is not valid JSON: {err}") from err
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelDirError(f"{model_dir} is not an mlx-lm model: config.json has no model_type")
    return cast(dict[str, object], config)


def layer_count(config: dict[str, object], model_dir: Path) -> int:
    n_layers = _first_int(config, _LAYER_COUNT_KEYS)
    if n_layers is None or n_layers < 1:
        raise ModelDirError(f"{model_dir} has no `layers` (config.json gives no layer count)")
    return n_layers


def context_length(config: dict[str, object]) -> int | None:
    return _first_int(config, _CONTEXT_KEYS)


def _first_int(config: dict[str, object], keys: tuple[str, ...]) -> int | None:
    nested = config.get("text_config")  # multimodal configs keep the language model's here
    text_config = cast(dict[str, object], nested) if isinstance(nested, dict) else {}
    for source in (config, text_config):
        for key in keys:
            value = source.get(key)
            if isinstance(value, int):
                return value
    return None


def weight_bytes(model_dir: Path) -> int:
    """The bytes of the model's weights on disk (its `*.safetensors` files): what a node holds in
    memory to serve it, before its KV cache."""
    return sum(path.stat().st_size for path in model_dir.glob("*.safetensors"))


def estimated_weight_bytes(config: dict[str, object]) -> int:
    """The weights' bytes estimated from `config.json` alone (a Hub model whose weights are not on
    this machine): embeddings, attention and MLP per layer, at the stored precision."""
    hidden = _first_int(config, ("hidden_size", "d_model", "n_embd")) or 0
    vocab = _first_int(config, ("vocab_size",)) or 0
    layers = _first_int(config, _LAYER_COUNT_KEYS) or 0
    mlp = _first_int(config, ("intermediate_size", "ffn_dim", "n_inner")) or 4 * hidden
    params = 2 * vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * mlp)
    quantization = config.get("quantization")
    if isinstance(quantization, dict):
        bits = cast(dict[str, object], quantization).get("bits")
        return params * (bits if isinstance(bits, int) else 4) // 8
    dtype = str(config.get("torch_dtype", "float16"))
    return params * (4 if dtype == "float32" else 2)
