"""How a batch uses the cores its ranks share when they run on one machine (`shoal up --workers 2`).

Ranks on separate machines overlap: on the decode ring (`micro_batches.py`) rank r works on one
micro-batch while rank r-1 works on the next. Ranks on one machine share its cores, and there two
things pay that do not across machines:

- *The decode in lockstep*, every row in one micro-batch going through the ranks one after
  another, when the model's weights dominate a step. On the ring each rank reads its layers'
  weights once per micro-batch, twice per round of tokens on two ranks, and two ranks reading at
  once share the machine's memory bandwidth: a 100M-parameter qwen3 (200 MB of weights per rank)
  decoded 16 streams at 0.78x of one rank on the ring, 0.92-0.95x in lockstep. A small model's
  step is mostly the rank's own overhead, which the ring does overlap: the tiny model (13 MB a
  rank) decoded them at ~1,350 tok/s on the ring, ~1,200 in lockstep. Each rank votes from its own
  layers (`lockstep_vote`), and one all-reduce at the same point on every rank (`agree_lockstep`,
  before the batch is built) makes the mode agreed data: lockstep only if every rank votes for it.
- *Every core for the rank that computes while the others wait* (`runner.blas.BlasThreads`): a
  lockstep decode step with no prompt chunk in flight runs on one rank at a time, so that rank
  takes every core's BLAS thread; a step where ranks compute at once (the ring, pipelined prompt
  chunks, a whole prefill on the pipeline) takes its share, as before. The count never changes a
  token (`BlasThreads`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlx.utils import tree_flatten

from runner.blas import BlasThreads
from runner.engine.collectives import Collectives
from runner.engine.engine import Engine
from runner.engine.shard import LoadedShard
from runner.models.shard import model_layers

LOCKSTEP_WEIGHT_BYTES = 64 * 2**20  # a rank's layers from which its weights dominate a decode step here


def lockstep_vote(world: int, ranks_on_host: int, layer_bytes: int, least: int = LOCKSTEP_WEIGHT_BYTES) -> bool:
    """This rank's vote for the lockstep decode: several ranks, all on its machine (`ranks_on_host`,
    counted from the placement's ring hosts), and its layers' weights of at least `least` bytes."""
    return world > 1 and ranks_on_host == world and layer_bytes >= least


def owned_weight_bytes(shard: LoadedShard) -> int:
    """The bytes of the weights of this rank's layers (packed and scales, for a quantized model)."""
    placement = shard.placement
    layers = model_layers(shard.model)[placement.start : placement.end]
    arrays: list[Any] = [array for layer in layers for _, array in tree_flatten(layer.parameters())]
    return sum(int(array.nbytes) for array in arrays)


def agree_lockstep(collectives: Collectives, vote: bool) -> bool:
    """Every rank, at the same point, once: lockstep if every rank votes for it. One rank: no
    collective (its one micro-batch is lockstep anyway)."""
    if collectives.world == 1:
        return False
    return collectives.agree([int(vote)])[0] == collectives.world


@dataclass(frozen=True, slots=True)
class SharedCores:
    """A batch's use of its machine's cores: the agreed decode mode, and this rank's BLAS threads."""

    lockstep: bool = False  # agreed (`agree_lockstep`); False: the ring, as on separate machines
    blas: BlasThreads = field(default_factory=lambda: BlasThreads(1, 1, None))

    def before_step(self, alone_at_work: bool) -> None:
        """`alone_at_work`: this step's forwards go through the ranks one after another (a lockstep
        decode step with no prompt chunk to compute or in flight): this rank takes every core."""
        self.blas.overlapping(not alone_at_work)


def agreed_cores(engine: Engine, env: Mapping[str, str], least: int = LOCKSTEP_WEIGHT_BYTES) -> SharedCores:
    """Every rank, at the same point, before its batch is built: the decode mode every rank agreed
    (one all-reduce on several ranks) and this rank's BLAS threads (from its environment:
    `runner.blas.blas_env`). `least`: the weight bytes from which a rank votes for lockstep."""
    collectives = engine.collectives
    try:
        layer_bytes = owned_weight_bytes(engine.shard)
    except Exception:  # a family whose layers hold their weights otherwise: this rank votes for the ring
        layer_bytes = 0  # (never skips the all-reduce every other rank waits in)
    vote = lockstep_vote(collectives.world, engine.ranks_on_host, layer_bytes, least)
    return SharedCores(agree_lockstep(collectives, vote), BlasThreads.from_env(env))
