"""Admission by KV memory (runner/engine/kv_budget.py), pure, and as the batch's next composition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.batch_plan import AgreedStep
from runner.engine.kv_budget import (
    MAX_CAPACITY_TOKENS,
    admissible,
    batch_need,
    budget_bytes,
    reservation,
    token_capacity,
    too_large,
)
from runner.engine.step_plan import Composition, next_composition


def test_budget_is_the_setting_or_half_the_available_memory() -> None:
    assert budget_bytes(1 << 30, available_bytes=64 << 30) == 1 << 30
    assert budget_bytes(0, available_bytes=8 << 30) == 4 << 30
    assert budget_bytes(0, available_bytes=8 << 30, ranks_on_host=2) == 2 << 30  # two ranks on one machine
    assert budget_bytes(1 << 30, available_bytes=8 << 30, ranks_on_host=2) == 1 << 30  # a setting is per rank
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        budget_bytes(-1, 0)


def test_capacity_counts_this_ranks_tokens_and_is_unbounded_when_unknown() -> None:
    assert token_capacity(1 << 20, 16 * 1024) == 64
    assert token_capacity(1 << 20, None) == MAX_CAPACITY_TOKENS
    assert token_capacity(1 << 62, 1) == MAX_CAPACITY_TOKENS  # fits its int32 slot


def test_a_padded_batch_weighs_its_longest_row_times_its_rows() -> None:
    assert reservation(100, 28) == 128
    assert batch_need([128, 1000, 10]) == 3000
    assert batch_need([]) == 0


@pytest.mark.parametrize(
    ("held", "pending", "capacity", "expected"),
    [
        ([], [100, 100, 100], 300, 3),  # all fit
        ([], [100, 100, 100], 250, 2),  # the third waits
        ([200], [100], 300, 0),  # a short one beside a long one costs the long one's room
        ([], [50, 400, 50], 300, 3),  # the one that can never fit is let through (to fail), not a wall
        ([100], [0, 100], 200, 2),  # an unrunnable one (0) holds nothing
        ([100, 100], [300], 250, 1),  # too large alone: admitted to fail even into a full batch
    ],
)
def test_admissible_takes_newcomers_in_log_order_while_the_batch_fits(
    held: list[int], pending: list[int], capacity: int, expected: int
) -> None:
    assert admissible(held, pending, capacity) == expected


@given(
    st.lists(st.integers(1, 500), max_size=6),
    st.lists(st.integers(0, 500), max_size=8),
    st.integers(0, 3000),
)
def test_what_is_admitted_always_fits_with_what_is_held(held: list[int], pending: list[int], capacity: int) -> None:
    taken = admissible(held, pending, capacity)
    assert 0 <= taken <= len(pending)
    fitting = [need for need in pending[:taken] if 0 < need <= capacity]
    if batch_need(held) <= capacity:  # what runs already is never pushed over by a newcomer
        assert batch_need([*held, *fitting]) <= capacity
    if taken < len(pending):  # the next one waits only because it does not fit now
        assert 0 < pending[taken] <= capacity
        assert batch_need([*held, *fitting, pending[taken]]) > capacity


def test_too_large_says_what_to_change() -> None:
    assert too_large(100, 100) is None
    message = too_large(5000, 4000)
    assert message is not None and "5000" in message and "4000" in message and "max_tokens" in message


def test_the_next_composition_admits_within_the_agreed_capacity_and_the_rest_wait() -> None:
    current = Composition(rows=("a",), admitted=1)
    step = AgreedStep(received=4, cancelled=(False,), tokens=(5,), kv_capacity=600)
    needs = {"a": 200, "b": 200, "c": 200, "d": 200}
    moved = next_composition(
        current,
        step,
        stopped_rows=frozenset(),
        prefilled=frozenset(),
        join_room=0,
        pending=["b", "c", "d"],
        max_batch=8,
        reservations=needs,
    )
    assert moved.newcomers == ("b", "c")  # 3 x 200 fits 600; the fourth waits
    freed = next_composition(
        current,
        AgreedStep(received=4, cancelled=(False,), tokens=(5,), kv_capacity=600),
        stopped_rows=frozenset({"a"}),
        prefilled=frozenset(),
        join_room=0,
        pending=["b", "c", "d"],
        max_batch=8,
        reservations=needs,
    )
    assert freed.newcomers == ("b", "c", "d")  # a finished: its room is free at the same step


def test_a_ranks_kv_per_token_is_its_layers_key_and_value_widths() -> None:
    """Measured from the owned layers' k/v projections in the activations' dtype: the tiny model's
    shape gives 2 x kv_heads x head_dim x 4 bytes per layer; a layer it cannot size gives None."""
    import json

    import mlx.nn as nn
    from mlx_lm.utils import load_model

    from runner.models.kv_size import kv_bytes_per_token
    from runner.models.tiny import cached_tiny

    config = json.loads((cached_tiny() / "config.json").read_text())
    per_layer = 2 * config["num_key_value_heads"] * (config["hidden_size"] // config["num_attention_heads"]) * 4
    model, _ = load_model(cached_tiny(), lazy=True)
    layers: list[nn.Module] = getattr(model, "layers")  # noqa: B009 (mlx-lm types it loosely)
    assert kv_bytes_per_token(layers) == len(layers) * per_layer
    assert kv_bytes_per_token(layers[2:5]) == 3 * per_layer
    assert kv_bytes_per_token([*layers[:1], nn.Linear(4, 4)]) is None
    # kv_bits: the packed values plus a float32 scale and bias per group (mx.quantize's layout)
    width = per_layer // 4
    assert kv_bytes_per_token(layers, 8, 64) == len(layers) * (width + 2 * (width // 64) * 4)
    assert kv_bytes_per_token(layers, 4, 32) == len(layers) * (width // 2 + 2 * (width // 32) * 4)


def test_the_ranks_on_a_machine_are_those_with_its_ring_host() -> None:
    from runner.service.main import ranks_on_host

    hosts = ["127.0.0.1:5000", "127.0.0.1:5001", "10.0.0.2:5000"]
    assert [ranks_on_host(hosts, rank) for rank in range(3)] == [2, 2, 1]
    assert ranks_on_host(["[::1]:5000", "[::1]:5001"], 1) == 2  # an IPv6 address keeps its colons
