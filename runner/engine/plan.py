"""Pure planning for prefill: chunking, path gate, per-rank iteration schedule, callbacks.

Nothing here touches MLX, so every decision that shapes the sequence of collectives can be
table-tested. The engine derives the whole per-task schedule from these functions and from
agreed values only (the request every rank received, the world size, the all-reduced cancel
vote), which is what keeps every rank issuing the same collectives in the same order.

Vocabulary: a prompt of L tokens is prefilled in chunks covering its first L-1 tokens; the
last token goes through the first decode step (exactly as mlx-lm's `generate_step`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from events.vocabulary import PrefillPath
from runner.errors import SplitError

PathChoice = Literal["auto", PrefillPath]

# Past four stages the per-rank chunk would get too small to keep a core busy.
MAX_STEP_DIVISOR = 4


def effective_step(prefill_step_size: int, world: int) -> int:
    """Chunk size used by both prefill paths: `prefill_step_size // min(4, world)`, at least 1."""
    if prefill_step_size < 1:
        raise ValueError(f"prefill_step_size must be >= 1, got {prefill_step_size}")
    return max(1, prefill_step_size // min(MAX_STEP_DIVISOR, max(1, world)))


def chunk_sizes(prompt_len: int, step: int) -> list[int]:
    """Sizes of the prefill chunks for a prompt of `prompt_len` tokens (last token reserved)."""
    remaining = max(0, prompt_len - 1)
    sizes: list[int] = []
    while remaining > 0:
        size = min(step, remaining)
        sizes.append(size)
        remaining -= size
    return sizes


# A key that a prompt token attends to costs 2-2.5 times its share of the flops on a CPU: on the
# tiny model a 256-token chunk took 211 ms at offset 0 and 624 ms at offset 1,792 by itself (about
# 770 keys cost one token's matmuls, where the flops say 1,536), and the batch's steps that carry
# chunks priced at 2.0 grew from 91 to 104 ms along a 2,000-token prompt (about 600 keys).
ATTENTION_KEY_COST = 2.5
# A chunk never shrinks below this fraction of the step: past it a very long prompt would take more
# steps than its share of each step saves the running streams.
SMALLEST_CHUNK_DIVISOR = 8


def keys_per_token(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int) -> float:
    """How many attended keys cost as much as one token's matmuls in a layer (attention projections
    and a gated MLP): the exchange rate `balanced_chunk_sizes` prices a chunk's attention at."""
    attention_width = heads * head_dim
    params = hidden * (2 * attention_width + 2 * kv_heads * head_dim) + 3 * hidden * intermediate
    # per token: 2 flops per parameter; per key: 4 flops per attention channel (q.k, then p.v)
    return 2 * params / (4 * attention_width * ATTENTION_KEY_COST)


def model_keys_per_token(config: Mapping[str, Any]) -> float | None:
    """`keys_per_token` from a model's config (config.json, or vars() of mlx-lm's ModelArgs: the
    llama/qwen/mistral field names); None when the shape is not that one (no intermediate_size: MoE)."""
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if not isinstance(hidden, int) or not isinstance(heads, int) or hidden <= 0 or heads <= 0:
        return None
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    intermediate = config.get("intermediate_size")
    if not all(isinstance(v, int) and v > 0 for v in (kv_heads, head_dim, intermediate)):
        return None
    return keys_per_token(hidden, heads, kv_heads, head_dim, intermediate)  # pyright: ignore[reportArgumentType]


def chunk_cost(size: int, offset: int, keys: float) -> float:
    """Cost, in attended keys, of prefilling `size` tokens after `offset` cached ones: each token's
    matmuls (`keys` per token) plus the keys it attends to (the cache and the chunk up to itself)."""
    return size * (keys + offset + (size + 1) / 2)


def prefill_cost(size: int, offset: int, keys: float | None) -> float:
    """`chunk_cost`, or the chunk's tokens when the model's shape is not known (`keys` None)."""
    return float(size) if keys is None else chunk_cost(size, offset, keys)


def balanced_chunk_sizes(prompt_len: int, step: int, cached: int, keys: float | None, room: float = 1.0) -> list[int]:
    """Chunks of prompt tokens [cached, prompt_len - 1) that each cost at most `room` times what a
    fresh prompt's first chunk of `step` tokens costs: a late chunk attends to everything before it,
    so equal token counts would make the step that carries it slower than one chunk's time (a batch
    interleaves these chunks with its rows' decode, and leaves `room` for them: `pace.chunk_room`).
    `keys` None (the model's shape is not known): `chunk_sizes` of `room` times `step` tokens."""
    if not 0.0 < room <= 1.0:
        raise ValueError(f"room must be in (0, 1], got {room}")
    if keys is None:
        return chunk_sizes(prompt_len - cached, max(1, int(step * room)))
    budget = chunk_cost(step, 0, keys) * room
    smallest = max(1, step // SMALLEST_CHUNK_DIVISOR)
    sizes: list[int] = []
    offset, end = cached, max(cached, prompt_len - 1)
    while offset < end:
        size = min(step, end - offset, max(smallest, _largest_within(budget, offset, keys)))
        sizes.append(size)
        offset += size
    return sizes


def _largest_within(budget: float, offset: int, keys: float) -> int:
    """The largest size whose `chunk_cost` at `offset` is within `budget` (the quadratic's root,
    then corrected by a step either way against float rounding)."""
    linear = keys + offset + 0.5
    size = int(math.sqrt(linear * linear + 2 * budget) - linear)
    while size > 0 and chunk_cost(size, offset, keys) > budget:
        size -= 1
    while chunk_cost(size + 1, offset, keys) <= budget:
        size += 1
    return size


def choose_path(prompt_len: int, prefill_step_size: int, world: int, choice: PathChoice = "auto") -> PrefillPath:
    """The gate: overlap only when there are at least two chunks to overlap (the 23-token wedge)."""
    if choice != "auto":
        return choice
    if world < 2:
        return "sequential"
    n_chunks = len(chunk_sizes(prompt_len, effective_step(prefill_step_size, world)))
    return "pipeline" if n_chunks >= 2 else "sequential"


def newcomer_prefill(
    prompt_len: int,
    prefill_step_size: int,
    world: int,
    choice: PathChoice,
    *,
    alone: bool,
    cached: int,
    keys: float | None,
    room: float,
) -> tuple[PrefillPath, list[int]]:
    """How a continuous batch prefills a newcomer, from agreed data only: admitted into an empty batch
    (`alone`) with nothing cached, the path a task alone would take (`choose_path`: on several ranks
    a long prompt overlaps its chunks through the pipeline, in the chunks a task alone takes);
    otherwise sequential chunks of equal cost from the cached prefix, riding the rows' steps, each
    leaving `room` for the rows' decode (`balanced_chunk_sizes`, `pace.chunk_room`)."""
    step = effective_step(prefill_step_size, world)
    path = choose_path(prompt_len, prefill_step_size, world, choice) if alone and not cached else "sequential"
    if path == "pipeline":
        return path, chunk_sizes(prompt_len, step)
    return path, balanced_chunk_sizes(prompt_len, step, cached, keys, room)


def rank_schedule(rank: int, world: int, n_chunks: int, path: PrefillPath) -> list[int | None]:
    """What `rank` does at each prefill iteration: a chunk index, or None for an idle iteration.

    Pipeline (GPipe): `rank` leading idle iterations, the chunks, `world-1-rank` trailing idle
    ones, so every rank runs `n_chunks + world - 1` iterations and chunk k reaches rank r at
    iteration k + r. Sequential: one iteration per chunk on every rank.
    """
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside world of {world}")
    chunks: list[int | None] = list(range(n_chunks))
    if path == "sequential":
        return chunks
    return [None] * rank + chunks + [None] * (world - 1 - rank)


def even_split(n_layers: int, world: int) -> list[tuple[int, int]]:
    """Contiguous ranges, the first `n_layers % world` ranks taking one extra layer."""
    if world < 1:
        raise SplitError(f"need at least 1 rank, got {world}")
    if world > n_layers:
        raise SplitError(f"{world} ranks but the model has only {n_layers} layers; use at most {n_layers}")
    base, extra = divmod(n_layers, world)
    ranges, start = [], 0
    for rank in range(world):
        end = start + base + (1 if rank < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def split_from_counts(counts: list[int], n_layers: int) -> list[tuple[int, int]]:
    """`--split 4,4` style layer counts per rank -> validated [start, end) ranges."""
    ranges, start = [], 0
    for count in counts:
        ranges.append((start, start + count))
        start += count
    return validate_split(ranges, n_layers)


def validate_split(ranges: list[tuple[int, int]], n_layers: int) -> list[tuple[int, int]]:
    """Check ranges are non-empty, contiguous from 0 and cover exactly `n_layers` layers."""
    if not ranges:
        raise SplitError("empty layer split: give one range per rank")
    if len(ranges) > n_layers:
        raise SplitError(f"{len(ranges)} ranks but the model has only {n_layers} layers")
    expected_start = 0
    for rank, (start, end) in enumerate(ranges):
        if end <= start:
            raise SplitError(f"rank {rank} has an empty layer range [{start}, {end})")
        if start != expected_start:
            raise SplitError(f"layer split is not contiguous: rank {rank} starts at {start}, expected {expected_start}")
        expected_start = end
    if expected_start != n_layers:
        raise SplitError(f"layer split covers {expected_start} layers but the model has {n_layers}")
    return [(int(s), int(e)) for s, e in ranges]
