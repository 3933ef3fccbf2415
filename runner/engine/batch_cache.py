"""The KV cache of the decoding rows of a continuous batch, on one rank.

A stream prefills into its own `ShardCache` (plain per-layer caches, as a task alone does); when
its prompt is in, `join` merges those caches into the batch's with mlx-lm's batched caches
(`KVCache.merge` gives a left-padded `BatchKVCache`, `extend` appends rows, `filter` drops them:
the pieces mlx-lm's own `BatchGenerator` uses). A batch of one does not pay for batching: one row
decodes on its own plain caches, exactly as a task alone does (no padding mask per step), merged
at the second row's join and extracted back (`extract`) when one row is left. Only distinct cache
objects are merged: the slots
of layers another rank owns alias an owned cache (see `ShardCache`), and keep aliasing its
batched successor, so masks built from any slot see the right offsets and padding.
"""

from __future__ import annotations

from collections.abc import Callable
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

    def join(self, stream: ShardCache) -> None:
        """Append `stream`'s prefilled caches as the last row."""
        if self.rows == 1:
            self._rebuild(lambda i: _merged([self.slots[i], stream.slots[i]]))
        else:
            for i, source in enumerate(self._source):
                if source == i:
                    self.slots[i].extend(_merged([stream.slots[i]]))
        self.rows += 1

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


def _merged(caches: list[Any]) -> Any:
    if not hasattr(caches[0], "merge"):
        raise ValueError(f"{type(caches[0]).__name__} cannot be batched (no merge in mlx-lm)")
    return caches[0].merge(caches)
