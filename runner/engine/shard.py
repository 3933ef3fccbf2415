"""One rank's shard as the engine holds it: where it sits in the pipeline (`ShardPlacement`), the
loaded model with its stage boundaries wired (`LoadedShard`, `wire_stages`), and the per-task KV
cache over its layers (`ShardCache`).

The full layer list keeps its length (layers owned elsewhere become weightless pass-throughs),
so model code that indexes layers or caches by position (sliding-window patterns, mask
sources) keeps working for every family. Caches of layers owned elsewhere alias an owned
cache of the same kind, so masks built from them see the right offset. Reading a model from disk
is the shells' (`runner/shard_loading.py`): nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from runner.engine.protocols import PeerWait
from runner.engine.sends import PassThroughLayer, PendingSends, ReceiveGate, StageBoundaryLayer


@dataclass(frozen=True, slots=True)
class ShardPlacement:
    rank: int
    world: int
    layer_ranges: tuple[tuple[int, int], ...]

    @property
    def start(self) -> int:
        return self.layer_ranges[self.rank][0]

    @property
    def end(self) -> int:
        return self.layer_ranges[self.rank][1]

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.world - 1


@dataclass(slots=True)
class LoadedShard:
    model: nn.Module
    tokenizer: TokenizerWrapper
    placement: ShardPlacement
    n_layers: int
    context_length: int | None
    outbox: PendingSends  # the boundary layer sends into it; the engine decides when they go
    peer_wait: PeerWait | None = None  # the agreement's blocking wait for the left neighbour (several ranks)
    receive_gate: ReceiveGate = field(default_factory=ReceiveGate)  # the boundary's receive waits there


def wire_stages(
    layers: list[nn.Module],
    placement: ShardPlacement,
    group: mx.distributed.Group | None,
    outbox: PendingSends,
    receive_gate: ReceiveGate,
) -> None:
    """Make `layers` (the list the model iterates) this rank's shard: the layers it does not own
    become pass-throughs, and on several ranks its first and last owned layers receive from the
    previous rank and send to the next (`sends.py`)."""
    for index in range(len(layers)):
        if not placement.start <= index < placement.end:
            layers[index] = PassThroughLayer(layers[index])
    if placement.world > 1:
        if group is None:
            raise ValueError("a multi-rank placement needs a distributed group")
        _add_boundaries(layers, placement, group, outbox, receive_gate)


def _add_boundaries(
    layers: list[nn.Module],
    placement: ShardPlacement,
    group: mx.distributed.Group,
    outbox: PendingSends,
    receive_gate: ReceiveGate,
) -> None:
    first, last = placement.start, placement.end - 1
    recv_from = None if placement.is_first else placement.rank - 1
    send_to = None if placement.is_last else placement.rank + 1
    boundary = partial(StageBoundaryLayer, group=group, outbox=outbox, receive_gate=receive_gate)
    if first == last:
        layers[first] = boundary(layers[first], recv_from=recv_from, send_to=send_to)
        return
    layers[first] = boundary(layers[first], recv_from=recv_from, send_to=None)
    layers[last] = boundary(layers[last], recv_from=None, send_to=send_to)


class ShardCache:
    """The per-task KV cache of one shard: full-length slot list, owned slots real, others aliases.

    `kv_bits`: the owned plain KV caches are quantized from the first token (mlx-lm's
    `QuantizedKVCache`), so a prompt's first chunk attends to its own keys as every later one does,
    and a sequence holds the same bits whether it prefills alone, in a batched forward of several
    prompts or from a prefix cache entry (docs/ARCHITECTURE.md §7). Sliding-window caches stay
    unquantized: mlx-lm cannot quantize a RotatingKVCache."""

    def __init__(
        self, model: nn.Module, placement: ShardPlacement, kv_bits: int | None = None, kv_group_size: int = 64
    ) -> None:
        self.model, self.placement = model, placement
        self.kv_bits, self.kv_group_size = kv_bits, kv_group_size
        self.slots: list[Any] = make_prompt_cache(model)
        self.owned = list(range(placement.start, placement.end))
        if kv_bits is not None:
            for index in self.owned:
                cache = self.slots[index]
                if type(cache) is KVCache:
                    self.slots[index] = cache.to_quantized(group_size=kv_group_size, bits=kv_bits)
        self._realias()

    def empty_like(self) -> ShardCache:
        """A fresh cache of the same shard and quantization."""
        return ShardCache(self.model, self.placement, self.kv_bits, self.kv_group_size)

    def _realias(self) -> None:
        by_kind = {}
        for index in self.owned:
            by_kind.setdefault(_cache_kind(self.slots[index]), index)
        for index in range(len(self.slots)):
            if index not in self.owned:
                source = by_kind.get(_cache_kind(self.slots[index]))
                if source is not None:
                    self.slots[index] = self.slots[source]

    def states(self) -> list[Any]:
        return [self.slots[index].state for index in self.owned]

    def release(self) -> None:
        """Drop this task's references to its KV: a batch's cache holds it now (or a copy of it),
        and a decoding row would otherwise keep its prompt's KV twice for its whole life."""
        self.slots, self.owned = [], []

    def replace_owned(self, caches: list[Any]) -> None:
        """Start from these caches of the owned layers, in order (a prefix the prefix cache reuses)."""
        for index, cache in zip(self.owned, caches, strict=True):
            self.slots[index] = cache
        self._realias()


def _cache_kind(cache: Any) -> tuple[str, Any, Any]:
    # After quantization an alias must follow the quantized cache, so kinds compare the
    # unquantized family: a QuantizedKVCache stands for the KVCache it replaced.
    name = type(cache).__name__
    if name == "QuantizedKVCache":
        name = "KVCache"
    return name, getattr(cache, "max_size", None), getattr(cache, "keep", None)
