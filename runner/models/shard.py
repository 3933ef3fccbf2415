"""Where a loaded mlx-lm model keeps its layers (`model_layers`): the list the engine shards
(`runner/engine/shard.py`) and sizes (`kv_size`, `shared_cores`)."""

from __future__ import annotations

import mlx.nn as nn

from runner.errors import ModelDirError


def model_layers(model: nn.Module) -> list[nn.Module]:
    """The list object the model really iterates, so replacing an entry takes effect.

    `model.layers` is sometimes a fresh slice (mlx-lm's PipelineMixin models, e.g. qwen2), so
    look for the stored list holding the same layer objects.
    """
    layers = getattr(model, "layers", None)
    if not isinstance(layers, list) or not layers:
        raise ModelDirError(f"{type(model).__module__} has no `layers` list; shoal needs one to shard it")
    stored = _find_stored_list(model, layers, depth=3)
    if stored is None:
        raise ModelDirError(f"{type(model).__module__}: cannot find where its `layers` list is stored")
    return stored


def _find_stored_list(module: nn.Module, layers: list[nn.Module], depth: int) -> list[nn.Module] | None:
    for value in module.values():
        if (
            isinstance(value, list)
            and len(value) == len(layers)
            and all(a is b for a, b in zip(value, layers, strict=True))
        ):
            return value
    if depth > 0:
        for value in module.values():
            if isinstance(value, nn.Module):
                found = _find_stored_list(value, layers, depth - 1)
                if found is not None:
                    return found
    return None
