"""`shoal model make-tiny`: a small random-weight llama in a standard mlx-lm directory.

Deterministic from its parameters (same bytes on every run), no download. It is the default
model of the tests and of `shoal up`; the `tiny` keyword resolves to a cached copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

# Bump when the generated files change, so cached copies under the data dir are rebuilt.
TINY_FORMAT_VERSION = 3  # 3: the chat template renders tools

# mlx's default init makes a random llama collapse onto one repeated token whatever the prompt;
# a larger spread in the projections makes the output depend on the context, so "same tokens
# as 1 rank" is a meaningful test.
PROJECTION_GAIN = 3.0


@dataclass(frozen=True, slots=True)
class TinySpec:
    layers: int = 8
    hidden: int = 256
    vocab: int = 1024
    seed: int = 0
    context: int = 4096

    def params_hash(self) -> str:
        blob = json.dumps({"v": TINY_FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def model_config(spec: TinySpec, eos_ids: list[int]) -> dict[str, object]:
    heads = max(1, spec.hidden // 64)
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "intermediate_size": spec.hidden * 3,
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 2),
        "rms_norm_eps": 1e-5,
        "vocab_size": spec.vocab,
        "rope_theta": 10000.0,
        "max_position_embeddings": spec.context,
        "tie_word_embeddings": True,
        "eos_token_id": eos_ids,
        "torch_dtype": "float32",
    }


def make_tiny(out_dir: Path, spec: TinySpec) -> Path:
    """Write the model into `out_dir` (created if needed); returns `out_dir`."""
    from runner.models.tiny_tokenizer import EOS_TOKEN, write_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    special_ids = write_tokenizer(out_dir, spec.vocab)
    return write_random_model(out_dir, model_config(spec, [special_ids[EOS_TOKEN]]), spec.seed)


def write_random_model(out_dir: Path, config: dict[str, object], seed: int) -> Path:
    """Random weights for any mlx-lm family named by `config["model_type"]` (tests of other
    families reuse the tiny tokenizer with this)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes  # the same family lookup load_model uses

    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    flat = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))
    weights = {name: value * PROJECTION_GAIN if "proj" in name else value for name, value in sorted(flat)}
    mx.eval(weights)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out_dir


def data_dir() -> Path:
    configured = os.environ.get("SHOAL_DATA_DIR")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "shoal"


def tiny_dir(models_dir: Path, spec: TinySpec) -> Path:
    """Where the tiny model of `spec` lies in a models directory."""
    return models_dir / f"tiny-{spec.params_hash()}"


def built_tiny(models_dir: Path, spec: TinySpec) -> Path:
    """`tiny_dir(models_dir, spec)`, built there first if it is not.

    Built in a sibling temp dir and renamed into place, so concurrent first uses never see a
    half-written model.
    """
    target = tiny_dir(models_dir, spec)
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-", dir=target.parent))
    try:
        make_tiny(staging, spec)
        # If another process won the race, its copy is identical: keep it.
        with contextlib.suppress(OSError):
            staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def cached_tiny(spec: TinySpec | None = None) -> Path:
    """The `tiny` keyword: the make-tiny directory under the data dir, built on first use."""
    return built_tiny(data_dir() / "models", spec or TinySpec())
