"""What one token of KV weighs on a rank (`engine.kv_budget`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

_FLOATS = (mx.float16, mx.bfloat16, mx.float32)


def kv_bytes_per_token(layers: Sequence[nn.Module], kv_bits: int | None = None, kv_group_size: int = 64) -> int | None:
    """Bytes of KV one token adds across these (owned) layers: each layer's key and value
    projections' output widths, in the activations' dtype (its norms', never quantized), or with
    `kv_bits` packed at that many bits plus a scale and a bias in that dtype per `kv_group_size`
    values (`mx.quantize`'s layout). None when a layer has no k/v projections (a family whose cache
    shoal cannot size; it is not bounded)."""
    total = 0
    for layer in layers:
        params = cast(list[tuple[str, Any]], tree_flatten(layer.parameters()))
        widths = [int(v.shape[0]) for k, v in params if k.endswith(("k_proj.weight", "v_proj.weight"))]
        floats = [v.dtype for k, v in params if v.dtype in _FLOATS and "norm" in k]
        if len(widths) != 2 or not floats:
            return None
        width = sum(widths)
        if kv_bits is None:
            total += width * floats[0].size
        else:
            total += width * kv_bits // 8 + 2 * (width // kv_group_size) * floats[0].size
    return total
