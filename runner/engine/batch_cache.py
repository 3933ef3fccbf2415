"""The KV cache of the decoding rows of a continuous batch, on one rank.

A stream prefills into its own `ShardCache` (per-layer caches, as a task alone does); when
its prompt is in, `join` merges those caches into the batch's with mlx-lm's batched caches
(a left-padded `BatchKVCache`, or its quantized counterpart `BatchQuantizedKVCache` under
`kv_bits`; `filter` drops rows: the pieces mlx-lm's own `BatchGenerator` uses; `joined` writes
KV caches into it once, with room to decode into, where `merge` and `extend` copy them up to
three times). A batch of one does not pay for batching: one row
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
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

from runner.engine.quantized_batch_cache import BatchQuantizedKVCache
from runner.engine.shard import ShardCache

# The caches whose positions can be taken back, cut to a prefix and joined by copying rows.
KV_CACHES = (KVCache, BatchKVCache, QuantizedKVCache, BatchQuantizedKVCache)


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
        """Whether every row's last position can be taken back (`trim`): KV caches only, plain or
        quantized (a sliding window may have overwritten a key, a recurrent state cannot go back)."""
        return all(type(self.slots[index]) in KV_CACHES for index in self._owned)

    def trim(self, tokens: int) -> None:
        """Take back the last `tokens` positions of every row (a step computed ahead, not needed)."""
        for cache in {id(self.slots[index]): self.slots[index] for index in self._owned}.values():
            cache.trim(tokens)

    def states(self) -> list[Any]:
        return [self.slots[index].state for index in self._owned]

    def snapshot(self, row: int) -> tuple[list[Any], int] | None:
        """A copy of `row`'s KV on this rank's layers, independent of the batch's arrays (a prefix
        cache entry), and its bytes; None unless every layer holds a KV cache, plain or quantized (a
        sliding window or a recurrent state cannot be cut to a shorter prefix)."""
        owned = [self.slots[index] for index in self._owned]
        if self.rows == 1 and all(type(cache) in (KVCache, QuantizedKVCache) for cache in owned):
            copies: list[Any] = [_prefix_of(cache, cache.offset) for cache in owned]  # the row's own caches
        elif all(type(cache) in (BatchKVCache, BatchQuantizedKVCache) for cache in owned):
            copies = [cache.extract(row) for cache in owned]
        else:
            return None
        mx.eval([(copy.keys, copy.values) for copy in copies])
        return copies, sum(copy.nbytes for copy in copies)


def join_room(remaining_tokens: Sequence[int], slack: int = 2) -> int:
    """Positions to leave after the rows' KV when they are (re)built at a join: what the row with
    the most tokens still to decode needs (`remaining_tokens`, its max_tokens less those decoded,
    plus `slack` for a step computed ahead), at most mlx-lm's growth step. Every join copies every
    row's buffer, so room no row can use is paid for at every join and every leave (16 rows of
    64 tokens: a 256-position room made each step after a join ~10 ms longer than a step); a row
    that needs more than the room grows the buffer as mlx-lm's cache does."""
    return max(1, min(BatchKVCache.step, max(remaining_tokens, default=0) + slack))


def prefix_caches(entry: list[Any], length: int) -> list[Any]:
    """A stream's own caches holding the first `length` tokens of a prefix cache entry. New array
    objects (slices): the stream's prefill writes into its caches, never into the entry."""
    return [_prefix_of(source, length) for source in entry]


def row_caches(caches: list[Any], row: int) -> list[Any]:
    """Row `row` of batched plain caches (a forward of several prompts at once), as one stream's own
    caches: its keys and values up to the offset, in new array objects (slices)."""
    return [_prefix_of(source, source.offset, rows=slice(row, row + 1)) for source in caches]


def _prefix_of(source: Any, length: int, rows: slice = slice(None)) -> Any:
    """A cache of the first `length` tokens of `source` (of its `rows`), of its own kind (plain, or
    quantized alike), in arrays of its own (slices; keys and values are [rows, heads, tokens, ·])."""
    if isinstance(source.keys, tuple | list):
        cache: Any = QuantizedKVCache(group_size=source.group_size, bits=source.bits)
        cache.keys, cache.values = _parts(source.keys, length, rows), _parts(source.values, length, rows)
    else:
        cache = KVCache()
        cache.keys, cache.values = source.keys[rows, :, :length, :], source.values[rows, :, :length, :]
    cache.offset = length
    return cache


def joined(current: Any, newcomers: Sequence[Any], batched: bool, room: int = BatchKVCache.step) -> Any:
    """One layer's cache of the rows (`current`: batched, or one row's own cache) with the
    `newcomers`' own caches as its last rows. KV caches, plain or quantized (`kv_bits`), are written
    once, right-aligned at the longest, into buffers with `room` positions to spare: mlx-lm's `merge`
    then `extend` pad, concatenate and leave the buffer full, so the next decode step copies it all
    again to grow it (a 2,000-token newcomer made that step of every row ~70 ms longer on a CPU),
    and joining the newcomers of one step one at a time would copy every row once per newcomer
    (eight newcomers made the next step of 16 short rows ~35 ms longer); mlx-lm has no batched
    quantized cache at all (`quantized_batch_cache`). Other kinds of cache (sliding windows,
    recurrent states) go through mlx-lm's own `merge` / `extend`."""
    layout = _layout([current, *newcomers])
    if layout is None:
        if batched:
            current.extend(_merged(list(newcomers)))
            return current
        return _merged([current, *newcomers])
    views = [_view(current), *(_view(n) for n in newcomers)]
    longest = max(view.length for view in views)
    rows = sum(view.offsets.shape[0] for view in views)
    cache = layout.batched(rows)
    filled = [view for view in views if view.keys is not None and view.values is not None and view.length]
    if filled:
        assert filled[0].keys is not None and filled[0].values is not None
        cache.keys = layout.unwrap(_rows_written(views, "keys", filled[0].keys, rows, longest + room, longest))
        cache.values = layout.unwrap(_rows_written(views, "values", filled[0].values, rows, longest + room, longest))
    cache.left_padding = mx.concatenate([view.left_padding + (longest - view.length) for view in views])
    cache.offset = mx.concatenate([view.offsets for view in views])
    cache._idx = longest
    return cache


@dataclass(frozen=True, slots=True)
class _Layout:
    """How one layer's rows are stored: plain KV arrays, or `mx.quantize` triples (`kv_bits`)."""

    quantization: tuple[int, int] | None  # (group_size, bits), None: plain

    def batched(self, rows: int) -> Any:
        if self.quantization is None:
            return BatchKVCache([0] * rows)
        group_size, bits = self.quantization
        return BatchQuantizedKVCache([0] * rows, group_size, bits)

    def unwrap(self, parts: tuple[Any, ...]) -> Any:
        return parts[0] if self.quantization is None else parts


def _layout(caches: Sequence[Any]) -> _Layout | None:
    """The storage every one of these caches shares, or None (another kind, or a mix)."""
    if all(type(cache) in (KVCache, BatchKVCache) for cache in caches):
        return _Layout(None)
    if all(type(cache) in (QuantizedKVCache, BatchQuantizedKVCache) for cache in caches):
        kinds = {(cache.group_size, cache.bits) for cache in caches}
        if len(kinds) == 1:
            return _Layout(kinds.pop())
    return None


def _rows_written(
    views: Sequence[_KVView], side: str, like: tuple[Any, ...], rows: int, size: int, longest: int
) -> tuple[Any, ...]:
    """Buffers of `size` positions holding every view's `side` (keys or values) right-aligned at
    `longest`, written in place: each row's KV copied once (no padded copies)."""
    buffers = tuple(mx.zeros((rows, part.shape[1], size, part.shape[3]), dtype=part.dtype) for part in like)
    row = 0
    for view in views:
        count = view.offsets.shape[0]
        parts = getattr(view, side)
        if parts is not None and view.length:
            for buffer, part in zip(buffers, parts, strict=True):
                buffer[row : row + count, :, longest - view.length : longest] = part
        row += count
    return buffers


@dataclass(frozen=True, slots=True)
class _KVView:
    keys: tuple[Any, ...] | None  # each [rows, heads, length, ·] (one array plain, three quantized), or None
    values: tuple[Any, ...] | None
    length: int  # positions written (a batched cache's rows are right-aligned at it)
    left_padding: Any  # per row
    offsets: Any  # tokens per row


def _view(cache: Any) -> _KVView:
    if isinstance(cache, BatchKVCache | BatchQuantizedKVCache):
        if getattr(cache, "_right_padding", None) is not None:
            raise ValueError("a batched cache with right padding cannot be joined (finalize it first)")
        length, left_padding, offsets = cache._idx, cache.left_padding, cache.offset
    else:
        length, left_padding, offsets = cache.offset, mx.array([0]), mx.array([cache.offset])
    keys, values = cache.keys, cache.values
    if keys is None or values is None:
        return _KVView(None, None, length, left_padding, offsets)
    return _KVView(_parts(keys, length), _parts(values, length), length, left_padding, offsets)


def _parts(stored: Any, length: int, rows: slice = slice(None)) -> tuple[Any, ...]:
    """The first `length` positions of `rows` of plain (one array) or quantized (a triple) KV."""
    parts = stored if isinstance(stored, tuple | list) else (stored,)
    return tuple(part[rows, :, :length, :] for part in parts)


def _merged(caches: list[Any]) -> Any:
    if not hasattr(caches[0], "merge"):
        raise ValueError(f"{type(caches[0]).__name__} cannot be batched (no merge in mlx-lm)")
    return caches[0].merge(caches)
