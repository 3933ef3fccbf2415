"""A left-padded batch of quantized KV caches: mlx-lm's `BatchKVCache` layout with
`QuantizedKVCache`'s storage.

mlx-lm has a batched cache for plain KV (`BatchKVCache`) and a quantized cache for one sequence
(`QuantizedKVCache`), not both at once, so `kv_bits` could not serve a continuous batch. This one
keeps keys and values as `mx.quantize` triples (packed data, scales, biases), each
[rows, heads, positions, ·], rows right-aligned at `_idx` behind their `left_padding`, exactly as
`BatchKVCache` lays them out. Quantization groups run along the head dimension, so every position
of every row is quantized on its own: joining, filtering or extracting rows copies quantized
groups and never quantizes anything twice, and a row's KV holds the same bits batched or alone.
Padding positions are zeros (data, scales and biases: they dequantize to 0) and the mask hides them.

The model sees `bits` and `group_size`, so mlx-lm's attention takes its quantized path
(`quantized_scaled_dot_product_attention`), with the padding mask `BatchKVCache` builds.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache

Quantized = tuple[Any, ...]  # mx.quantize's (data, scales, biases), each [rows, heads, positions, ·]


def empty_quantized(
    rows: int, heads: int, positions: int, dims: int, dtype: Any, group_size: int, bits: int
) -> Quantized:
    """Zeroed buffers for `positions` quantized positions of `dims`-wide keys or values."""
    per_word = 32 // bits
    shape = (rows, heads, positions)
    return (
        mx.zeros((*shape, dims // per_word), dtype=mx.uint32),
        mx.zeros((*shape, dims // group_size), dtype=dtype),
        mx.zeros((*shape, dims // group_size), dtype=dtype),
    )


def positions_of(parts: Quantized, start: int, end: int, rows: slice = slice(None)) -> Quantized:
    """Positions [start, end) of `rows` of a quantized triple (slices, no copy)."""
    return tuple(part[rows, :, start:end, :] for part in parts)


class BatchQuantizedKVCache:
    """Rows of quantized KV, left-padded and right-aligned at `_idx` (see the module docstring)."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int, bits: int) -> None:
        self.keys: Quantized | None = None
        self.values: Quantized | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-padding for padding in left_padding])
        self._idx = 0
        self.group_size, self.bits = group_size, bits

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Quantized, Quantized]:
        rows, heads, count, key_dims = keys.shape
        previous = self._idx
        if self.keys is None or self.values is None or previous + count > self.keys[0].shape[2]:
            grow = (self.step + count - 1) // self.step * self.step
            fresh_keys = empty_quantized(rows, heads, grow, key_dims, keys.dtype, self.group_size, self.bits)
            fresh_values = empty_quantized(rows, heads, grow, values.shape[3], values.dtype, self.group_size, self.bits)
            if self.keys is None or self.values is None:
                self.keys, self.values = fresh_keys, fresh_values
            else:
                self.keys = _grown(self.keys, fresh_keys, previous)
                self.values = _grown(self.values, fresh_values, previous)
        self.offset = self.offset + count
        self._idx += count
        quantized_keys = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        quantized_values = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for buffer, written in zip(self.keys, quantized_keys, strict=True):
            buffer[..., previous : self._idx, :] = written
        for buffer, written in zip(self.values, quantized_values, strict=True):
            buffer[..., previous : self._idx, :] = written
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Quantized, Quantized]:
        assert self.keys is not None and self.values is not None
        return positions_of(self.keys, 0, self._idx), positions_of(self.values, 0, self._idx)

    @property
    def state(self) -> tuple[Any, ...]:
        return self.keys, self.values, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, value: tuple[Any, ...]) -> None:
        self.keys, self.values, self.offset, self.left_padding, self._idx = value

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def make_mask(self, queries: int, return_array: bool = False, **kwargs: Any) -> Any:
        """The causal mask of `queries` new positions, hiding each row's padding (`BatchKVCache`'s)."""
        return create_causal_mask(queries, offset=self._idx, left_padding=self.left_padding, **kwargs)

    def filter(self, batch_indices: Any) -> None:
        """Keep these rows, in this order; drop the padding every kept row has."""
        if self.keys is not None and self.values is not None:
            self.keys = tuple(part[batch_indices] for part in self.keys)
            self.values = tuple(part[batch_indices] for part in self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shared_padding = min(cast(list[int], self.left_padding.tolist()))
        if shared_padding > 0:
            if self.keys is not None and self.values is not None:
                self.keys = tuple(part[..., shared_padding:, :] for part in self.keys)
                self.values = tuple(part[..., shared_padding:, :] for part in self.values)
            self._idx -= shared_padding
            self.left_padding = self.left_padding - shared_padding

    def extract(self, idx: int) -> QuantizedKVCache:
        """Row `idx` as one sequence's own quantized cache, in arrays of its own."""
        cache = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        padding = cast(int, self.left_padding[idx].item())
        if self.keys is not None and self.values is not None:
            rows = slice(idx, idx + 1)
            cache.keys = tuple(mx.contiguous(part) for part in positions_of(self.keys, padding, self._idx, rows))
            cache.values = tuple(mx.contiguous(part) for part in positions_of(self.values, padding, self._idx, rows))
        cache.offset = self._idx - padding
        return cache

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        return sum(part.nbytes for part in (*self.keys, *self.values))


def _grown(current: Quantized, fresh: Quantized, used: int) -> Quantized:
    """`current`'s first `used` positions followed by `fresh`'s (mlx-lm's growth by whole steps)."""
    return tuple(mx.concatenate([part[..., :used, :], more], axis=2) for part, more in zip(current, fresh, strict=True))
