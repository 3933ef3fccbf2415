"""The prefix cache's pure decisions: longest match, LRU by bytes, and the agreement across ranks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.batch_plan import StepLayout
from runner.engine.prefix_cache import PrefixIndex, agreed_prefix, common_prefix


def index(bound: int, *entries: tuple[list[int], str, int]) -> PrefixIndex[str]:
    built: PrefixIndex[str] = PrefixIndex(bound)
    for tokens, value, nbytes in entries:
        built.insert(tokens, value, nbytes)
    return built


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix_equals_the_plain_loop(a: list[int], b: list[int]) -> None:
    expected = 0
    while expected < min(len(a), len(b)) and a[expected] == b[expected]:
        expected += 1
    assert common_prefix(a, b) == expected


class CountingTuple(tuple[int, ...]):
    """A tuple that counts the elements its slices copy."""

    copied = 0

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            CountingTuple.copied += len(range(*index.indices(len(self))))
        return tuple.__getitem__(self, index)


@pytest.mark.parametrize("shared", [0, 10, 1000])
def test_common_prefix_work_grows_with_the_shared_part_not_the_length(shared: int) -> None:
    """A newcomer's lookup runs on the step loop against every cached conversation: one that shares
    only a chat template's header with a 100k-token prompt must not cost a copy of it."""
    length = 100_000
    a = CountingTuple([*range(shared), -1, *range(length)])
    b = CountingTuple([*range(shared), -2, *range(length)])
    CountingTuple.copied = 0
    assert common_prefix(a, b) == shared
    assert CountingTuple.copied <= 8 * (shared + 1) + 64


def test_the_longest_match_never_covers_the_last_prompt_token() -> None:
    cache = index(100, ([1, 2, 3, 4, 5, 6], "turn1", 10))
    assert cache.longest([1, 2, 3, 4, 5, 6, 7, 8]) == cache.longest([1, 2, 3, 4, 5, 6, 9])
    match = cache.longest([1, 2, 3, 4, 5, 6, 7])
    assert match is not None and (match.length, match.value) == (6, "turn1")
    exact = cache.longest([1, 2, 3, 4, 5, 6])  # the whole entry: the last token still runs
    assert exact is not None and exact.length == 5
    partial = cache.longest([1, 2, 9, 9])  # a branch reuses the shared part, cut from a longer entry
    assert partial is not None and partial.length == 2
    assert cache.longest([7, 1, 2]) is None
    assert cache.longest([1]) is None  # one token: nothing to reuse


def test_the_longer_entry_wins_and_a_tie_goes_to_the_most_recent() -> None:
    cache = index(100, ([1, 2, 3], "short", 1), ([1, 2, 3, 4, 5], "long", 1), ([1, 2, 8], "other", 1))
    assert cache.longest([1, 2, 7, 7]).value == "other"  # pyright: ignore[reportOptionalMemberAccess]
    assert cache.longest([1, 2, 3, 4, 5, 6]).value == "long"  # pyright: ignore[reportOptionalMemberAccess]
    assert cache.longest([1, 2, 7, 7]).value == "long"  # pyright: ignore[reportOptionalMemberAccess]


def test_an_entry_extending_another_replaces_it() -> None:
    cache = index(100, ([1, 2, 3], "turn1", 30), ([1, 2, 3, 4, 5], "turn2", 50))
    assert cache.lru_order() == [(1, 2, 3, 4, 5)]
    assert cache.nbytes == 50


def test_least_recently_used_goes_first_and_a_hit_is_a_use() -> None:
    cache = index(100, ([1, 1], "a", 40), ([2, 2], "b", 40))
    assert cache.longest([1, 1, 0]) is not None  # "a" is now the most recent
    cache.insert([3, 3], "c", 40)
    assert cache.lru_order() == [(1, 1), (3, 3)]
    assert cache.nbytes == 80


def test_an_entry_over_the_bound_is_not_kept_and_zero_disables() -> None:
    cache = index(100, ([1, 1], "a", 40), ([2, 2], "big", 101))
    assert cache.lru_order() == [(1, 1)]
    off = index(0, ([1, 1], "a", 1))
    assert not off.enabled and len(off) == 0 and off.longest([1, 1, 1]) is None
    with pytest.raises(ValueError, match=">= 0 bytes"):
        PrefixIndex(-1)


@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=6), st.integers(1, 60)), max_size=30))
def test_the_byte_bound_always_holds_and_counts_what_is_kept(inserts: list[tuple[list[int], int]]) -> None:
    cache: PrefixIndex[int] = PrefixIndex(100)
    sizes: dict[tuple[int, ...], int] = {}
    for tokens, nbytes in inserts:
        cache.insert(tokens, nbytes, nbytes)
        sizes[tuple(tokens)] = nbytes
        assert cache.nbytes <= 100
        assert cache.nbytes == sum(sizes[key] for key in cache.lru_order())
        assert tuple(tokens) in cache.lru_order()  # the newest entry always stays (each fits the bound)


def test_agreement_takes_the_shortest_proposal() -> None:
    assert agreed_prefix([40, 12, 33]) == 12
    assert agreed_prefix([40, 0]) == 0  # a rank that evicted the entry: nothing is reused
    assert agreed_prefix([]) == 0


def test_the_step_vector_carries_every_ranks_proposals_and_the_batch_uses_their_minimum() -> None:
    layout = StepLayout(world=3, max_batch=2)
    vectors = [
        layout.encode(0, 2, [], [], [40, 7]),
        layout.encode(1, 2, [], [], [25, 7]),
        layout.encode(2, 1, [], [3, 4], [40]),  # holds one pending assignment only
    ]
    summed = [sum(column) for column in zip(*vectors, strict=True)]
    agreed = layout.decode(summed)
    assert agreed.cached == (25, 0)
    assert agreed.runnable == (True, False)  # the second is not held by rank 2 yet (and not admitted)
    assert agreed.tokens == (3, 4) and agreed.received == 1
    with pytest.raises(ValueError, match="max_batch=2"):
        layout.encode(0, 0, [], [], [1, 2, 3])


def test_an_assignment_one_rank_cannot_build_is_unrunnable_on_every_rank() -> None:
    layout = StepLayout(world=2, max_batch=2)
    vectors = [layout.encode(0, 2, [], [], [0, 12]), layout.encode(1, 2, [], [], [None, 12])]
    agreed = layout.decode([sum(column) for column in zip(*vectors, strict=True)])
    assert agreed.runnable == (False, True) and agreed.cached == (0, 12)


def test_clear_forgets_everything_in_place() -> None:
    index: PrefixIndex[str] = PrefixIndex(100)
    index.insert([1, 2, 3], "kv", 10)
    held = index  # a holder of the index (the batch's newcomers) sees the same, emptied one
    index.clear()
    assert held.longest([1, 2, 3, 4]) is None and len(held) == 0 and held.nbytes == 0
    held.insert([1, 2], "kv2", 10)
    assert index.longest([1, 2, 5]) is not None


def test_a_scope_reuses_only_its_own_entries_within_one_shared_bound() -> None:
    """Two API keys' requests (scopes) never reuse each other's KV, even for the same tokens: a
    shared cache would tell one user, by `cached_tokens`, how much of a prompt another one sent."""
    cache: PrefixIndex[str] = PrefixIndex(100)
    cache.insert([1, 2, 3, 4], "alice's", 10, scope="alice")
    assert cache.longest([1, 2, 3, 4, 5], scope="bob") is None
    assert cache.longest([1, 2, 3, 4, 5]) is None  # nor the keyless scope
    assert cache.longest([1, 2, 3, 4, 5], scope="alice").value == "alice's"  # pyright: ignore[reportOptionalMemberAccess]
    cache.insert([1, 2, 3, 4, 5, 6], "bob's", 10, scope="bob")  # extends alice's tokens: hers stays
    assert cache.lru_order("alice") == [(1, 2, 3, 4)] and cache.lru_order("bob") == [(1, 2, 3, 4, 5, 6)]
    assert cache.longest([1, 2, 3, 4, 5, 6, 7], scope="alice").length == 4  # pyright: ignore[reportOptionalMemberAccess]
    cache.insert([1, 2, 3, 4, 5, 6, 7], "alice's longer", 10, scope="alice")  # extends her own: it goes
    assert cache.lru_order("alice") == [(1, 2, 3, 4, 5, 6, 7)]
    cache.insert([9] * 5, "carol's", 85, scope="carol")  # the bound is shared: the least recent go first
    assert cache.nbytes <= 100 and cache.lru_order("bob") == [] and cache.lru_order("carol") == [(9,) * 5]
