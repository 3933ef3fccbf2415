"""`batch_cache.joined` against mlx-lm's own `merge` / `extend`: the same rows, tokens, padding and
keys/values in every position a row attends to, and room to decode into without growing the
buffer; and `trim` takes back exactly the positions a step wrote."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.models.cache import BatchKVCache, KVCache

from runner.engine.batch_cache import joined

pytestmark = pytest.mark.timeout(120)
HEADS, DIMS = 2, 4


def plain(length: int, seed: int) -> KVCache:
    cache = KVCache()
    if length:
        keys = mx.random.normal((1, HEADS, length, DIMS), key=mx.random.key(seed))
        cache.update_and_fetch(keys, keys * 2 + 1)
    return cache


def attended(cache: BatchKVCache) -> list[tuple[int, int, list[float], list[float]]]:
    """Per row: (tokens, left padding, keys and values of the positions it attends to)."""
    padding, offsets = cache.left_padding.tolist(), cache.offset.tolist()
    if cache.keys is None:
        return [(offsets[r], padding[r], [], []) for r in range(len(padding))]
    keys, values = cache.keys[..., : cache._idx, :], cache.values[..., : cache._idx, :]
    return [
        (
            offsets[r],
            padding[r],
            keys[r, :, padding[r] :].flatten().tolist(),
            values[r, :, padding[r] :].flatten().tolist(),
        )
        for r in range(len(padding))
    ]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=2, max_size=5), st.integers(0, 3))
def test_joining_rows_one_by_one_equals_mlx_lms_merge_and_extend(lengths: list[int], decoded: int) -> None:
    """Rows join one at a time, with decode steps written in between, as a batch grows."""
    ours: object = plain(lengths[0], 0)
    theirs: object = plain(lengths[0], 0)
    for index, length in enumerate(lengths[1:], start=1):
        ours = joined(ours, [plain(length, index)], batched=index > 1)
        theirs = KVCache.merge([theirs, plain(length, index)]) if index == 1 else theirs
        if index > 1:
            theirs.extend(KVCache.merge([plain(length, index)]))  # type: ignore[union-attr]
        for step in range(decoded):
            new = mx.full((index + 1, HEADS, 1, DIMS), float(step + 10 * index))
            ours.update_and_fetch(new, new)  # type: ignore[union-attr]
            theirs.update_and_fetch(new, new)  # type: ignore[union-attr]
    assert isinstance(ours, BatchKVCache) and isinstance(theirs, BatchKVCache)
    assert ours._idx == theirs._idx
    assert attended(ours) == attended(theirs)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=4), st.lists(st.integers(0, 40), min_size=1, max_size=5))
def test_rows_joining_at_one_step_equal_joining_them_one_at_a_time(first: list[int], newcomers: list[int]) -> None:
    """The newcomers of one step join in one rebuild; the rows and what each attends to are the
    same as joining them one by one."""
    base: object = plain(first[0], 0)
    for index, length in enumerate(first[1:], start=1):
        base = joined(base, [plain(length, index)], batched=index > 1)
    batched = len(first) > 1
    together = joined(base, [plain(length, 100 + i) for i, length in enumerate(newcomers)], batched=batched)
    one_by_one = base
    for i, length in enumerate(newcomers):
        one_by_one = joined(one_by_one, [plain(length, 100 + i)], batched=batched or i > 0)
    assert isinstance(together, BatchKVCache) and isinstance(one_by_one, BatchKVCache)
    assert together._idx == one_by_one._idx
    assert attended(together) == attended(one_by_one)


def test_a_joined_cache_has_room_for_the_next_steps() -> None:
    cache = joined(plain(30, 0), [plain(300, 1)], batched=False)
    buffer = cache.keys
    assert cache._idx == 300 and buffer.shape[2] > 300
    step = mx.zeros((2, HEADS, 1, DIMS))
    cache.update_and_fetch(step, step)
    assert cache.keys.shape == buffer.shape  # written in place, not copied to a bigger buffer


def test_trim_takes_back_the_positions_a_step_wrote() -> None:
    from runner.engine.batch_cache import BatchShardCache

    def shard(seed: int) -> SimpleNamespace:  # what BatchShardCache reads of a ShardCache: one owned layer
        return SimpleNamespace(owned=[0], slots=[plain(5 + seed, seed)])

    cache = BatchShardCache(shard(0))  # type: ignore[arg-type]
    cache.join([shard(1)])  # type: ignore[list-item]
    before = attended(cache.slots[0])
    step = mx.ones((2, HEADS, 1, DIMS))
    cache.slots[0].update_and_fetch(step, step)
    assert cache.trimmable()
    cache.trim(1)
    assert attended(cache.slots[0]) == before


def test_the_room_at_a_join_is_what_the_neediest_row_still_decodes_at_most_mlx_lms_step() -> None:
    from runner.engine.batch_cache import join_room

    assert join_room([64, 10, 3]) == 66  # its 64 tokens, and a step computed ahead
    assert join_room([5000]) == BatchKVCache.step  # beyond it the buffer grows as mlx-lm's does
    assert join_room([]) == 2 and join_room([0]) == 2


def test_rows_decode_past_the_room_they_were_joined_with() -> None:
    """A room smaller than a row's needs only means the buffer grows: the positions stay right."""
    ours = joined(plain(7, 0), [plain(3, 1)], batched=False, room=2)
    theirs = KVCache.merge([plain(7, 0), plain(3, 1)])
    for step in range(5):
        new = mx.full((2, HEADS, 1, DIMS), float(step))
        ours.update_and_fetch(new, new)
        theirs.update_and_fetch(new, new)
    assert attended(ours) == attended(theirs)
