"""The prefix cache of one rank, pure: the KV of finished streams by token ids, LRU, bounded in bytes.

A conversation's next turn starts with the tokens of the previous one (its prompt and the
tokens generated for it), so the KV computed for them can be reused instead of prefilled again.
When a decoding row leaves the batch, every rank stores a copy of its row — its own layers only,
so the entries of one conversation weigh different bytes on different ranks — under the token
ids that row holds KV for. A newcomer's prompt then looks up the entry sharing its longest prefix.

Agreement (docs/ARCHITECTURE.md §6): the bound is per rank and eviction follows each rank's own
bytes, so ranks may hold different entries. Each rank *proposes* the length of its longest match
(`PrefixIndex.longest`), the step's all-reduce carries every rank's proposal
(`batch_plan.StepLayout`), and the newcomer reuses the minimum over ranks: every rank holds at
least that much (it keeps the matched entry from proposal to admission, `PrefixMatch.value`, so
an eviction in between cannot take it away; so at most `max_batch` held entries may outlive the
bound for a few steps) and cuts its copy to exactly that length. A proposal
never covers the whole prompt: the last prompt token always goes through the model, for logits.

Scopes: an entry reuses only for requests of its own scope (`GenerationRequest.cache_scope`: the
API key's id that owns the task, the same on every rank since it is in the log). Shared across keys,
the cache would be a side channel: a request's `cached_tokens` (and its time to first token) would
say how much of its prompt another user had sent, token by token. The byte bound is shared.

Why not mlx-lm's `LRUPromptCache`: it bounds entries by count as well as bytes, refreshes no entry
on a hit, hands back a deep copy already cut to its own choice of length, and an exact hit leaves
no token to run; here the length is agreed first and the copy is cut after. Like it, an entry
that a new one extends is dropped (the new one covers it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class PrefixMatch(Generic[V]):
    length: int  # prompt tokens this rank can reuse (its proposal)
    value: V  # the entry's KV, held by the newcomer until it is admitted


@dataclass(frozen=True, slots=True)
class _Entry(Generic[V]):
    value: V
    nbytes: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two sequences of one type, by slice comparisons (C speed on
    long prompts): windows doubling from the start until one differs, then a binary search inside
    it, so the work grows with the common prefix, not with the sequences (an unrelated cached
    conversation of 128k tokens costs microseconds, not a copy of itself)."""
    limit = min(len(a), len(b))
    low, width = 0, 1  # a[:low] == b[:low]
    while low < limit:
        high = min(limit, low + width)
        if a[low:high] == b[low:high]:
            low, width = high, width * 2
            continue
        while high - low > 1:  # the first difference lies in [low, high)
            middle = (low + high) // 2
            if a[low:middle] == b[low:middle]:
                low = middle
            else:
                high = middle
        return low
    return low


class PrefixIndex(Generic[V]):
    """Entries keyed by the token ids their KV covers, least recently used first, at most `max_bytes`
    in all (0 disables the cache: nothing is stored, nothing matches)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"prefix cache bound must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], _Entry[V]] = OrderedDict()  # (scope, tokens)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def lru_order(self, scope: str = "") -> list[tuple[int, ...]]:
        """The tokens of `scope`'s entries, least recently used first."""
        return [tokens for owner, tokens in self._entries if owner == scope]

    def longest(self, prompt: Sequence[int], scope: str = "") -> PrefixMatch[V] | None:
        """The entry of `scope` sharing the longest prefix with `prompt`, at most `len(prompt) - 1`
        tokens (the last token must go through the model); the most recently used one among equals.
        A hit counts as a use."""
        limit, prompt = len(prompt) - 1, tuple(prompt)  # a tuple, as the keys: a list never equals a tuple
        best: tuple[int, tuple[str, tuple[int, ...]]] | None = None
        for key in reversed(self._entries):  # most recent first: it wins a tie
            if key[0] != scope:
                continue
            length = min(limit, common_prefix(prompt, key[1]))
            if length > 0 and (best is None or length > best[0]):
                best = (length, key)
        if best is None:
            return None
        length, key = best
        self._entries.move_to_end(key)
        return PrefixMatch(length, self._entries[key].value)

    def insert(self, tokens: Sequence[int], value: V, nbytes: int, scope: str = "") -> None:
        """Store `value` (KV for exactly `tokens`) as `scope`'s most recent entry, drop the entries of
        `scope` it extends, then evict the least recently used of any scope until the bound holds
        (an entry larger than the bound is not kept at all)."""
        if not self.enabled or nbytes > self.max_bytes:
            return
        key = (scope, tuple(tokens))
        extended = [
            k for k in self._entries if k[0] == scope and len(k[1]) <= len(key[1]) and key[1][: len(k[1])] == k[1]
        ]
        for old in extended:
            self._drop(old)
        self._entries[key] = _Entry(value, nbytes)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Forget every entry, in place: whoever holds this index sees it empty."""
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: tuple[str, tuple[int, ...]]) -> None:
        self.nbytes -= self._entries.pop(key).nbytes


def agreed_prefix(proposals: Sequence[int]) -> int:
    """What a newcomer reuses: the shortest of the ranks' proposals (each rank holds at least that)."""
    return min(proposals, default=0)
