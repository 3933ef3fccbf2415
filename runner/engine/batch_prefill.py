"""Newcomers' first prompt chunks of one length in one forward ([k, n] instead of k forwards of [1, n]).

A burst of requests with prompts of the same length (clients sending the same template, a
benchmark) would otherwise take one small forward each: on a CPU most of such a forward is
per-operation overhead, so one batched forward costs about what two or three alone do. Each
stream's KV then becomes its own caches (`batch_cache.row_caches`), exactly as if it had
prefilled alone, and its later chunks and decode are unchanged.

Only chunks that start a prompt from an empty cache are batched (nothing cached from the prefix
cache, the first chunk, on a model whose every layer has a KV cache, plain or quantized): rows of
one length need no padding or mask beyond the causal one, so each row's attention and projections
are those of the prompt alone. Which chunks are batched follows from agreed data only (the composition, each
stream's chunks, the model's cache kinds, the same on every rank), so every rank runs the same
forwards, with the same shapes, in the same order: the activations each rank sends are what the
next one expects (docs/ARCHITECTURE.md §6).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import mlx.core as mx

from runner.engine.batch_cache import KV_CACHES, row_caches
from runner.engine.prefill import compute_chunk
from runner.engine.task_run import TaskRun


@dataclass(frozen=True, slots=True)
class ChunkWork:
    """One prefilling stream's chunk at this step, as every rank knows it."""

    tokens: list[int]  # the chunk's prompt tokens
    fresh: bool  # the prompt's first chunk, into an empty cache of KV caches only


def prefill_groups(work: Sequence[ChunkWork]) -> list[tuple[int, ...]]:
    """The chunks of this step as forwards, in order: the fresh chunks of one length together (at
    the place of the first of them), every other chunk alone."""
    groups: list[list[int]] = []
    by_length: dict[int, list[int]] = {}
    for index, chunk in enumerate(work):
        if not chunk.fresh:
            groups.append([index])
        elif len(chunk.tokens) in by_length:
            by_length[len(chunk.tokens)].append(index)
        else:
            by_length[len(chunk.tokens)] = [index]
            groups.append(by_length[len(chunk.tokens)])
    return [tuple(group) for group in groups]


def starts_fresh(run: TaskRun, cached: int, next_chunk: int) -> bool:
    """Whether a stream's chunk may be batched: its first, from empty KV caches, plain or quantized
    (the slots hold every layer's kind, the same on every rank)."""
    return cached == 0 and next_chunk == 0 and all(type(cache) in KV_CACHES for cache in run.caches.slots)


def compute_chunks(runs: Sequence[TaskRun], work: Sequence[ChunkWork]) -> None:
    """Run this rank's part of a step's chunks, each group in one forward; the sends stay queued
    for after the step's agreement (the next rank computes them at the next step: `batch_chunks`)."""
    for group in prefill_groups(work):
        if len(group) == 1:
            compute_chunk(runs[group[0]], mx.array(work[group[0]].tokens, dtype=mx.int32))
            continue
        first = runs[group[0]]
        together = replace(first, caches=first.caches.empty_like())
        compute_chunk(together, mx.array([work[i].tokens for i in group], dtype=mx.int32))
        for row, index in enumerate(group):
            runs[index].caches.replace_owned(row_caches([together.caches.slots[j] for j in first.caches.owned], row))
