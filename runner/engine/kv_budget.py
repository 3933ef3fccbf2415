"""Admission by KV memory, pure: how many newcomers the batch's KV cache can take now.

`max_batch` bounds how many sequences decode at once, not what their KV weighs: sixteen users
each sending a long prompt with a large `max_tokens` can hold more KV than a machine has, and a
rank killed for memory takes every task of its instance down with it. So each rank has a budget,
`kv_cache_bytes` (0: half the memory available once its shard is loaded, split between the
instance's ranks on that machine), and turns it into a
capacity in tokens of its own layers' KV (`token_capacity`).

What a stream may come to hold is known when it is admitted: its prompt plus what it may generate
(`reservation`, the completion room every rank computes alike). The batch's rows share one
left-padded cache per micro-batch (mlx-lm's `BatchKVCache`), so a batch of streams weighs its
count times its longest reservation (`batch_need`), not their sum: a short prompt beside a long
one takes as much room as the long one.

Agreement (docs/ARCHITECTURE.md §6): ranks hold different layers and different memory, so each
writes its capacity in its own slot of the step's all-reduce and the batch uses the minimum
(`batch_plan.AgreedStep.kv_capacity`). The reservations are the requests' and the members are
agreed, so every rank then computes the same `admissible` count: newcomers are taken in log order
while the batch still fits, and the rest wait in the queue for streams to leave. A request that
could not fit even alone is admitted (so it never blocks the ones behind it) and fails at
admission with an error that says what to change, on every rank alike.
"""

from __future__ import annotations

from collections.abc import Sequence

# The capacity travels in an int32 slot of the all-reduce, written by its own rank only.
MAX_CAPACITY_TOKENS = (1 << 31) - 1
# What `kv_cache_bytes` = 0 leaves to the KV: the rest is for activations, the prefix cache, the OS.
AUTO_SHARE_OF_AVAILABLE = 0.5


def budget_bytes(setting: int, available_bytes: int, ranks_on_host: int = 1) -> int:
    """The rank's KV budget: the setting, or (0) its share of half the memory available: the
    instance's ranks on one machine (`shoal up --workers 2`) split it."""
    if setting < 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {setting}")
    if setting > 0:
        return setting
    return int(max(0, available_bytes) * AUTO_SHARE_OF_AVAILABLE) // max(1, ranks_on_host)


def token_capacity(budget: int, bytes_per_token: int | None) -> int:
    """Tokens of this rank's KV the budget holds; unbounded (the slot's maximum) when the shard's
    KV per token is unknown (a family whose attention has no k/v projections) or none (no layer)."""
    if not bytes_per_token or bytes_per_token <= 0:
        return MAX_CAPACITY_TOKENS
    return min(MAX_CAPACITY_TOKENS, max(0, budget) // bytes_per_token)


def reservation(prompt_tokens: int, completion_room: int) -> int:
    """The most KV positions a stream can hold: its prompt and every token it may generate."""
    return prompt_tokens + completion_room


def batch_need(reservations: Sequence[int]) -> int:
    """Positions a batch of these streams can come to hold: rows are padded to the longest."""
    return len(reservations) * max(reservations, default=0)


def admissible(held: Sequence[int], pending: Sequence[int], capacity: int) -> int:
    """How many of the first `pending` reservations (in log order) join the batch now, beside the
    `held` ones (the members'), within `capacity`. One larger than the capacity alone counts as
    admissible (its admission fails it), so it never blocks the queue; 0 reservation: a request
    that fails at admission anyway (every rank says it cannot run it)."""
    taken = list(held)
    for count, need in enumerate(pending):
        if need > capacity or need == 0:
            continue  # admitted to fail: it holds nothing
        if batch_need([*taken, need]) > capacity:
            return count
        taken.append(need)
    return len(pending)


def too_large(need: int, capacity: int) -> str | None:
    """Why a request cannot run on this instance at all, or None."""
    if need <= capacity:
        return None
    return (
        f"the prompt and max_tokens need KV cache for {need} tokens, but this instance holds at most "
        f"{capacity} (its kv_cache_bytes on the rank with the least room): lower max_tokens, shorten "
        "the prompt, or raise kv_cache_bytes"
    )
