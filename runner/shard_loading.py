"""Load one rank's shard of an mlx-lm model from its directory: its layers [start, end) and the
stage boundaries wired (`runner/engine/shard.py`). The I/O of the runner's two shells (`service`,
`local`), kept out of `runner/engine/` (no I/O there) and out of `runner/models/` (which imports
nothing of the engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx

from runner.engine.plan import validate_split
from runner.engine.protocols import PeerWait
from runner.engine.sends import PendingSends, ReceiveGate
from runner.engine.shard import LoadedShard, ShardPlacement, wire_stages
from runner.models.model_info import read_model_info
from runner.models.shard import model_layers


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
    wire_stages(layers, placement, group, outbox, receive_gate)
    mx.eval(model.parameters())  # materialises only the owned layers (and embeddings / head)
    tokenizer = load_tokenizer(model_dir, eos_token_ids=_config_eos(config))
    return LoadedShard(model, tokenizer, placement, len(layers), info.context_length, outbox, peer_wait, receive_gate)


def _config_eos(config: dict[str, Any]) -> list[int] | None:
    eos = config.get("eos_token_id")
    if eos is None:
        return None
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
