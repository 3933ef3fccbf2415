"""Load one rank's shard of an mlx-lm model: its layers [start, end) and the stage boundaries.

The full layer list keeps its length (layers owned elsewhere become weightless pass-throughs),
so model code that indexes layers or caches by position (sliding-window patterns, mask
sources) keeps working for every family. Caches of layers owned elsewhere alias an owned
cache of the same kind, so masks built from them see the right offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from runner.engine.plan import validate_split
from runner.engine.protocols import PeerWait
from runner.engine.sends import PassThroughLayer, PendingSends, ReceiveGate, StageBoundaryLayer
from runner.errors import ModelDirError
from runner.models.model_info import read_model_info


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
    tokenizer: Any  # mlx_lm TokenizerWrapper
    placement: ShardPlacement
    n_layers: int
    context_length: int | None
    outbox: PendingSends  # the boundary layer sends into it; the engine decides when they go
    peer_wait: PeerWait | None = None  # the agreement's blocking wait for the left neighbour (several ranks)
    receive_gate: ReceiveGate = field(default_factory=ReceiveGate)  # the boundary's receive waits there


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


def load_shard(
    model_dir: Path,
    placement: ShardPlacement,
    group: mx.distributed.Group | None,
    peer_wait: PeerWait | None = None,
) -> LoadedShard:
    """`peer_wait` (several ranks): how this rank waits for its left neighbour without spinning
    (`runner/ring_wait.py`): before the receive of the boundary layer (`ReceiveGate`) and of each
    agreement (`Collectives`)."""
    from mlx_lm.utils import load_model, load_tokenizer

    info = read_model_info(model_dir)
    validate_split(list(placement.layer_ranges), info.n_layers)
    outbox = PendingSends()
    receive_gate = ReceiveGate(peer_wait)
    model, config = load_model(model_dir, lazy=True)
    layers = model_layers(model)
    for index in range(len(layers)):
        if not placement.start <= index < placement.end:
            layers[index] = PassThroughLayer(layers[index])
    if placement.world > 1:
        if group is None:
            raise ValueError("a multi-rank placement needs a distributed group")
        _add_boundaries(layers, placement, group, outbox, receive_gate)
    mx.eval(model.parameters())  # materialises only the owned layers (and embeddings / head)
    tokenizer = load_tokenizer(model_dir, eos_token_ids=_config_eos(config))
    return LoadedShard(model, tokenizer, placement, len(layers), info.context_length, outbox, peer_wait, receive_gate)


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


def _config_eos(config: dict[str, Any]) -> list[int] | None:
    eos = config.get("eos_token_id")
    if eos is None:
        return None
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]


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
