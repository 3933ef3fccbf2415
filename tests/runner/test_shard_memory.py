"""A rank holds only its own layers' weights (plus embeddings, final norm and head)."""

from __future__ import annotations

import re

import pytest

from runner.engine.shard import ShardCache, ShardPlacement
from runner.models.tiny import cached_tiny
from runner.shard_loading import load_shard

pytestmark = pytest.mark.timeout(60)


class _UnusedGroup:
    """Loading only stores the group in the boundary layers; no transfer happens here."""


def test_rank_materialises_only_its_layers() -> None:
    from mlx.utils import tree_flatten

    placement = ShardPlacement(rank=1, world=3, layer_ranges=((0, 2), (2, 5), (5, 8)))
    shard = load_shard(cached_tiny(), placement, _UnusedGroup())  # type: ignore[arg-type]
    names = [name for name, _ in tree_flatten(shard.model.parameters())]
    layer_ids = {int(m.group(1)) for name in names if (m := re.search(r"layers\.(\d+)\.", name))}
    assert layer_ids == {2, 3, 4}
    assert any("layers.2.inner." in name for name in names)  # wrapped: receives from rank 0
    assert any("layers.4.inner." in name for name in names)  # wrapped: sends to rank 2


def test_caches_of_other_ranks_layers_alias_an_owned_one() -> None:
    placement = ShardPlacement(rank=1, world=2, layer_ranges=((0, 4), (4, 8)))
    shard = load_shard(cached_tiny(), placement, _UnusedGroup())  # type: ignore[arg-type]
    cache = ShardCache(shard.model, placement)
    assert all(cache.slots[i] is cache.slots[4] for i in range(4))  # masks read cache[0]
    assert len({id(cache.slots[i]) for i in range(4, 8)}) == 4
    assert len(cache.states()) == 4
