"""The KV cache of the decoding rows of a continuous batch, on one rank.

A stream prefills into its own `ShardCache` (plain per-layer caches, as a task alone does); when
its prompt is in, `join` merges those caches into the batch's with mlx-lm's batched caches
(a left-padded `BatchKVCache`; `filter` drops rows: the pieces mlx-lm's own `BatchGenerator` uses;
`joined` writes plain KV caches into it once, with room to decode into, where `merge` and `extend`
copy them up to three times). A batch of one does not pay for batching: one row
decodes on its own plain caches, exactly as a task alone does (no padding mask per step), merged
at the second row's join and extracted back (`extract`) when one row is left. Only distinct cache
objects are merged: the slots
of layers another rank owns alias an owned cache (see `ShardCache`), and keep aliasing its
batched successor, so masks built from any slot see the right offsets and padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from runner.models.shard import ShardCache


class BatchShardCache:
    def __init__(self, first: ShardCache) -> None:
        self._owned = first.owned
        # slot -> the first slot holding the same object: aliases stay aliases after merging.
        self._source = [
            next(j for j in range(i + 1) if first.slots[j] is first.slots[i]) for i in range(len(first.slots))
        ]
        self.slots: list[Any] = list(first.slots)  # one row: the stream's own caches
        self.rows = 1

    def _rebuild(self, make: Callable[[int], Any]) -> None:
        """Every distinct slot rebuilt by `make(slot)`; aliases follow their source."""
        distinct = [make(i) if self._source[i] == i else None for i in range(len(self.slots))]
        self.slots = [distinct[self._source[i]] for i in range(len(distinct))]

    def join(self, streams: Sequence[ShardCache], room: int = BatchKVCache.step) -> None:
        """Append the `streams`' prefilled caches as the last rows, in order: every layer's buffers
        are built once, whatever the number of streams joining at this step, with `room` positions
        to decode into (`join_room`)."""
        if not streams:
            return
        batched = self.rows > 1
        self._rebuild(lambda i: joined(self.slots[i], [stream.slots[i] for stream in streams], batched, room))
        self.rows += len(streams)

    def keep(self, rows: tuple[int, ...]) -> None:
        """Keep these rows, in this order (the rows of streams that left are dropped)."""
        if len(rows) == self.rows:
            return
        if len(rows) == 1:  # back to the one row's own caches
            self._rebuild(lambda i: self.slots[i].extract(rows[0]))
        else:
            indices = mx.array(rows, dtype=mx.int32)
            for i, source in enumerate(self._source):
                if source == i:
                    self.slots[i].filter(indices)
        self.rows = len(rows)

    def trimmable(self) -> bool:
        """Whether every row's last position can be taken back (`trim`): plain KV caches only (a
        sliding window may have overwritten a key, a recurrent state cannot go back)."""
        return all(type(self.slots[index]) in (KVCache, BatchKVCache) for index in self._owned)

    def trim(self, tokens: int) -> None:
        """Take back the last `tokens` positions of every row (a step computed ahead, not needed)."""
        for cache in {id(self.slots[index]): self.slots[index] for index in self._owned}.values():
            cache.trim(tokens)

    def states(self) -> list[Any]:
        return [self.slots[index].state for index in self._owned]

    def snapshot(self, row: int) -> tuple[list[Any], int] | None:
        """A copy of `row`'s KV on this rank's layers, independent of the batch's arrays (a prefix
        cache entry), and its bytes; None unless every layer holds a plain batched KV cache (a
        sliding window or a recurrent state cannot be cut to a shorter prefix)."""
        owned = [self.slots[index] for index in self._owned]
        if self.rows == 1 and all(type(cache) is KVCache for cache in owned):
            copies: list[Any] = [_prefix_of(cache, cache.offset) for cache in owned]  # the row's own caches
        elif all(isinstance(cache, BatchKVCache) for cache in owned):
            copies = [cache.extract(row) for cache in owned]
        else:
            return None
        mx.eval([array for copy in copies for array in (copy.keys, copy.values)])
        return copies, sum(copy.nbytes for copy in copies)


def join_room(remaining_tokens: Sequence[int], slack: int = 2) -> int:
    """Positions to leave after the rows' KV when they are (re)built at a join: what the row with
    the most tokens still to decode needs (`remaining_tokens`, its max_tokens less those decoded,
    plus `slack` for a step computed ahead), at most mlx-lm's growth step. Every join copies every
    row's buffer, so room no row can use is paid for at every join and every leave (16 rows of
    64 tokens: a 256-position room made each step after a join ~10 ms longer than a step); a row
    that needs more than the room grows the buffer as mlx-lm's cache does."""
    return max(1, min(BatchKVCache.step, max(remaining_tokens, default=0) + slack))


def prefix_caches(entry: list[Any], length: int) -> list[KVCache]:
    """A stream's own caches holding the first `length` tokens of a prefix cache entry. New array
    objects (slices): the stream's prefill writes into its caches, never into the entry."""
    return [_prefix_of(source, length) for source in entry]


def row_caches(caches: list[Any], row: int) -> list[KVCache]:
    """Row `row` of batched plain caches (a forward of several prompts at once), as one stream's own
    caches: its keys and values up to the offset, in new array objects (slices)."""
    return [_prefix_of(source, source.offset, rows=slice(row, row + 1)) for source in caches]


def _prefix_of(source: Any, length: int, rows: slice = slice(None)) -> KVCache:
    """A plain cache of the first `length` tokens of `source` (of its `rows`), in arrays of its own
    (slices; keys and values are [rows, heads, tokens, dims])."""
    cache = KVCache()
    cache.keys, cache.values = source.keys[rows, :, :length, :], source.values[rows, :, :length, :]
    cache.offset = length
    return cache


def joined(current: Any, newcomers: Sequence[Any], batched: bool, room: int = BatchKVCache.step) -> Any:
    """One layer's cache of the rows (`current`: batched, or one row's plain cache) with the
    `newcomers`' plain caches as its last rows. Plain KV caches are written once, right-aligned at
    the longest, into buffers with `room` positions to spare: mlx-lm's `merge` then `extend` pad,
    concatenate and leave the buffer full, so the next decode step copies it all again to grow it
    (a 2,000-token newcomer made that step of every row ~70 ms longer on a CPU), and joining the
    newcomers of one step one at a time would copy every row once per newcomer (eight newcomers
    made the next step of 16 short rows ~35 ms longer). Other kinds of cache (sliding windows,
    recurrent states) go through mlx-lm's own `merge` / `extend`."""
    plain = type(current) in (KVCache, BatchKVCache) and all(type(n) is KVCache for n in newcomers)
    views = [_view(current), *(_view(n) for n in newcomers)] if plain else []
    filled = [view for view in views if view.keys is not None and view.length]
    if not filled:  # another kind of cache, or nothing written yet
        if batched:
            current.extend(_merged(list(newcomers)))
            return current
        return _merged([current, *newcomers])
    longest = max(view.length for view in views)
    shape, value_shape = filled[0].keys.shape, filled[0].values.shape
    rows = sum(view.offsets.shape[0] for view in views)
    keys = mx.zeros((rows, shape[1], longest + room, shape[3]), dtype=filled[0].keys.dtype)
    values = mx.zeros((rows, value_shape[1], longest + room, value_shape[3]), dtype=filled[0].values.dtype)
    row = 0
    for view in views:  # written in place: one buffer, each row's KV copied once (no padded copies)
        count = view.offsets.shape[0]
        if view.keys is not None and view.length:
            keys[row : row + count, :, longest - view.length : longest] = view.keys
            values[row : row + count, :, longest - view.length : longest] = view.values
        row += count
    cache = BatchKVCache([0] * rows)
    cache.keys, cache.values = keys, values
    cache.left_padding = mx.concatenate([view.left_padding + (longest - view.length) for view in views])
    cache.offset = mx.concatenate([view.offsets for view in views])
    cache._idx = longest
    return cache


@dataclass(frozen=True, slots=True)
class _KVView:
    keys: Any  # [rows, heads, length, dims], or None
    values: Any
    length: int  # positions written (a batched cache's rows are right-aligned at it)
    left_padding: Any  # per row
    offsets: Any  # tokens per row


def _view(cache: Any) -> _KVView:
    if isinstance(cache, BatchKVCache):
        if cache._right_padding is not None:
            raise ValueError("a batched cache with right padding cannot be joined (finalize it first)")
        length, left_padding, offsets = cache._idx, cache.left_padding, cache.offset
    else:
        length, left_padding, offsets = cache.offset, mx.array([0]), mx.array([cache.offset])
    keys, values = cache.keys, cache.values
    if keys is None or values is None:
        return _KVView(None, None, length, left_padding, offsets)
    return _KVView(keys[..., :length, :], values[..., :length, :], length, left_padding, offsets)


def _merged(caches: list[Any]) -> Any:
    if not hasattr(caches[0], "merge"):
        raise ValueError(f"{type(caches[0]).__name__} cannot be batched (no merge in mlx-lm)")
    return caches[0].merge(caches)
