"""Pure planning for prefill: chunking, path gate, per-rank iteration schedule, callbacks.

Nothing here touches MLX, so every decision that shapes the sequence of collectives can be
table-tested. The engine derives the whole per-task schedule from these functions and from
agreed values only (the request every rank received, the world size, the all-reduced cancel
vote), which is what keeps every rank issuing the same collectives in the same order.

Vocabulary: a prompt of L tokens is prefilled in chunks covering its first L-1 tokens; the
last token goes through the first decode step (exactly as mlx-lm's `generate_step`).
"""

from __future__ import annotations

from typing import Literal

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


def choose_path(prompt_len: int, prefill_step_size: int, world: int, choice: PathChoice = "auto") -> PrefillPath:
    """The gate: overlap only when there are at least two chunks to overlap (the 23-token wedge)."""
    if choice != "auto":
        return choice
    if world < 2:
        return "sequential"
    n_chunks = len(chunk_sizes(prompt_len, effective_step(prefill_step_size, world)))
    return "pipeline" if n_chunks >= 2 else "sequential"


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


def expected_callbacks(prompt_len: int, step: int) -> list[tuple[int, int]]:
    """The progress sequence of mlx-lm `stream_generate` for this prompt and step."""
    calls = [(0, prompt_len)]
    processed = 0
    for size in chunk_sizes(prompt_len, step):
        processed += size
        calls.append((processed, prompt_len))
    calls.append((prompt_len, prompt_len))
    return calls


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
