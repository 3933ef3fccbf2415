"""`BatchQuantizedKVCache` (kv_bits inside a continuous batch): rows joined, decoded into, filtered,
extracted and cut to a prefix hold exactly the quantized KV each sequence holds alone (quantization
groups run along the head dimension, so a row's bits never depend on the other rows), and the
attention mlx-lm computes over the padded batch is each row's attention alone."""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import QuantizedKVCache

from runner.engine.batch_cache import joined, prefix_caches, row_caches
from runner.engine.quantized_batch_cache import BatchQuantizedKVCache

pytestmark = pytest.mark.timeout(120)
HEADS, DIMS, GROUP = 2, 64, 32


def kv(rows: int, length: int, seed: int) -> tuple[mx.array, mx.array]:
    keys = mx.random.normal((rows, HEADS, length, DIMS), key=mx.random.key(seed))
    return keys, keys * 0.5 - 1


def alone(length: int, seed: int, bits: int) -> QuantizedKVCache:
    cache = QuantizedKVCache(group_size=GROUP, bits=bits)
    if length:
        cache.update_and_fetch(*kv(1, length, seed))
    return cache


def dequantized(parts: tuple[mx.array, ...], bits: int) -> list[float]:
    if parts[0].size == 0:
        return []
    return cast(list[float], mx.dequantize(*parts, group_size=GROUP, bits=bits).flatten().tolist())


def row_kv(cache: BatchQuantizedKVCache, row: int) -> tuple[list[float], list[float]]:
    """The keys and values row `row` attends to (after its padding), dequantized."""
    padding = cast(int, cache.left_padding[row].item())
    if cache.keys is None or cache.values is None:
        return [], []
    keys, values = cache.keys_and_values()
    pick = slice(row, row + 1)
    return (
        dequantized(tuple(p[pick, :, padding:] for p in keys), cache.bits),
        dequantized(tuple(p[pick, :, padding:] for p in values), cache.bits),
    )


def own_kv(cache: QuantizedKVCache) -> tuple[list[float], list[float]]:
    if cache.keys is None:
        return [], []
    keys, values = cast(tuple[Any, Any], cache.keys_and_values())
    return dequantized(keys, cache.bits), dequantized(values, cache.bits)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=2, max_size=5),
    st.integers(0, 3),
    st.sampled_from((4, 8)),
)
def test_rows_hold_what_each_sequence_holds_alone(lengths: list[int], decoded: int, bits: int) -> None:
    """Rows join one at a time and together, decode steps are written to the batch and to each
    sequence alone, then rows leave: every row's KV equals its own, bit for bit."""
    mine = [alone(length, seed, bits) for seed, length in enumerate(lengths)]
    batch: object = alone(lengths[0], 0, bits)
    batch = joined(batch, [alone(lengths[1], 1, bits)], batched=False, room=3)
    batch = joined(batch, [alone(n, seed, bits) for seed, n in enumerate(lengths[2:], start=2)], batched=True, room=3)
    assert isinstance(batch, BatchQuantizedKVCache)
    for step in range(decoded):
        new_keys, new_values = kv(len(lengths), 1, 100 + step)
        batch.update_and_fetch(new_keys, new_values)
        for row, cache in enumerate(mine):
            cache.update_and_fetch(new_keys[row : row + 1], new_values[row : row + 1])
    assert batch.offset.tolist() == [cache.offset for cache in mine]
    for row, cache in enumerate(mine):
        assert row_kv(batch, row) == own_kv(cache)
    kept = list(range(len(lengths)))[1::2] or [0]
    batch.filter(mx.array(kept, dtype=mx.int32))
    for row, index in enumerate(kept):
        assert row_kv(batch, row) == own_kv(mine[index])
        extracted = batch.extract(row)
        assert extracted.offset == mine[index].offset and own_kv(extracted) == own_kv(mine[index])
        shorter = mine[index].offset - 1
        if shorter > 0:
            (prefix,) = prefix_caches([extracted], shorter)
            assert mine[index].keys is not None and mine[index].values is not None
            expected = tuple(
                dequantized(tuple(p[..., :shorter, :] for p in side), bits)
                for side in cast(tuple[Any, Any], (mine[index].keys, mine[index].values))
            )
            assert prefix.offset == shorter and own_kv(prefix) == expected


@pytest.mark.parametrize("bits", (4, 8))
def test_attention_over_the_padded_batch_is_each_rows_own(bits: int) -> None:
    """mlx-lm's quantized attention with the batch's padding mask gives each row what it gets alone."""
    lengths = (5, 17, 1)
    mine = [alone(length, seed, bits) for seed, length in enumerate(lengths)]
    batch = joined(mine[0], [alone(n, seed, bits) for seed, n in enumerate(lengths[1:], start=1)], batched=False)
    queries = mx.random.normal((len(lengths), HEADS, 1, DIMS), key=mx.random.key(9))
    new_keys, new_values = kv(len(lengths), 1, 10)
    mask = batch.make_mask(1)
    keys, values = batch.update_and_fetch(new_keys, new_values)
    # mlx-lm scales the queries in place (`queries *= scale`): each call gets arrays of its own
    together = scaled_dot_product_attention(queries + 0, keys, values, batch, scale=DIMS**-0.5, mask=mask)
    for row, cache in enumerate(mine):
        own_keys, own_values = cache.update_and_fetch(new_keys[row : row + 1], new_values[row : row + 1])
        own = scaled_dot_product_attention(
            queries[row : row + 1] + 0, own_keys, own_values, cache, scale=DIMS**-0.5, mask=None
        )
        assert mx.allclose(together[row : row + 1], own, atol=1e-5).item(), row


def test_a_batched_prefill_splits_into_each_sequences_own_cache() -> None:
    """Prompts of one length prefilled in one [k, n] forward (`batch_prefill`): each row's cut equals
    the cache it would have filled alone."""
    together = QuantizedKVCache(group_size=GROUP, bits=8)
    keys, values = kv(3, 6, 4)
    together.update_and_fetch(keys, values)
    for row in range(3):
        (own,) = row_caches([together], row)
        single = QuantizedKVCache(group_size=GROUP, bits=8)
        single.update_and_fetch(keys[row : row + 1], values[row : row + 1])
        assert own.offset == 6 and own_kv(own) == own_kv(single)
