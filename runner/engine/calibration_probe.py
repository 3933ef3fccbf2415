"""The forwards `calibration.time_probes` times: this rank's own layers on synthetic activations.

Only the owned layers run, unwrapped from their stage boundaries, on fresh caches of their own: no
receive, no send, no collective, and nothing of any task's state is touched. The layers are called
the way the dense families shoal prices (llama, qwen, mistral) call them, `layer(x, mask, cache=...)`;
a family that calls them otherwise raises here, and the rank then proposes no rate (`calibration`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from runner.engine.sends import StageBoundaryLayer
from runner.engine.shard import LoadedShard
from runner.models.shard import model_layers

SEED = 0  # the activations' own key: the global PRNG, which seeded sampling never reads, is left alone


def owned_layers_forward(shard: LoadedShard) -> Callable[[int, int], Callable[[], Any]]:
    """`forward(size, offset)`: builds inputs and caches holding `offset` positions, evaluated, and
    returns the call that runs the owned layers over `size` new positions to completion."""
    placement = shard.placement
    layers = [_unwrapped(layer) for layer in model_layers(shard.model)[placement.start : placement.end]]
    args = vars(shard.model.args)  # pyright: ignore[reportAttributeAccessIssue]
    hidden, heads = int(args["hidden_size"]), int(args["num_attention_heads"])
    kv_heads = int(args.get("num_key_value_heads") or heads)
    head_dim = int(args.get("head_dim") or hidden // heads)
    dtype = _activation_dtype(layers)

    def forward(size: int, offset: int) -> Callable[[], Any]:
        caches = [KVCache() for _ in layers]
        if offset:
            prefix = mx.zeros((1, kv_heads, offset, head_dim), dtype=dtype)
            for cache in caches:
                cache.update_and_fetch(prefix, prefix)
        x = (mx.random.normal((1, size, hidden), key=mx.random.key(SEED)) * 0.1).astype(dtype)
        mx.eval(x, *(cache.state[:2] for cache in caches))

        def run() -> None:
            h = x
            mask = create_attention_mask(h, caches[0])
            for layer, cache in zip(layers, caches, strict=True):
                h = layer(h, mask, cache=cache)
            mx.eval(h)

        return run

    return forward


def _unwrapped(layer: Any) -> Any:
    return layer.inner if isinstance(layer, StageBoundaryLayer) else layer


def _activation_dtype(layers: list[Any]) -> Any:
    """The dtype the layers compute in: that of their first floating-point parameter (a norm's
    weight in a quantized model, whose matrices are packed integers)."""
    for layer in layers:
        for _, value in tree_flatten(layer.parameters()):
            if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
                return value.dtype
    return mx.float32
