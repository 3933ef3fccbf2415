"""The batch's prefill chunks of equal cost (`plan.balanced_chunk_sizes`), pure: they cover the prompt
exactly, none costs more than a fresh prompt's first chunk unless it is already the smallest allowed,
each is as long as that budget allows, and a model whose matmuls dwarf its attention gets even chunks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.plan import (
    SMALLEST_CHUNK_DIVISOR,
    PathChoice,
    balanced_chunk_sizes,
    chunk_cost,
    chunk_sizes,
    effective_step,
    keys_per_token,
    model_keys_per_token,
    newcomer_prefill,
)

pytestmark = pytest.mark.timeout(60)

TINY = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 768}


@given(
    prompt_len=st.integers(1, 20_000),
    step=st.integers(1, 4096),
    cached_fraction=st.floats(0, 1),
    keys=st.floats(1, 50_000),
    room=st.sampled_from([1.0, 0.9, 0.5]),
)
def test_chunks_cover_the_prompt_within_one_first_chunks_cost(
    prompt_len: int, step: int, cached_fraction: float, keys: float, room: float
) -> None:
    """`room` < 1: what a chunk may cost beside a decode step (`pace.chunk_room`)."""
    cached = int((prompt_len - 1) * cached_fraction)
    sizes = balanced_chunk_sizes(prompt_len, step, cached, keys, room)
    assert sum(sizes) == prompt_len - 1 - cached  # the last token goes through the first decode step
    budget, smallest = chunk_cost(step, 0, keys) * room, max(1, step // SMALLEST_CHUNK_DIVISOR)
    offset = cached
    for index, size in enumerate(sizes):
        assert 1 <= size <= step
        assert size <= smallest or chunk_cost(size, offset, keys) <= budget
        last = index == len(sizes) - 1
        if not last and size < step:  # as long as the budget allows
            assert size == smallest or chunk_cost(size + 1, offset, keys) > budget
        offset += size


def test_a_long_prompt_is_cut_shorter_as_it_goes_and_never_below_the_smallest_chunk() -> None:
    keys = model_keys_per_token(TINY)
    assert keys == 614.4
    sizes = balanced_chunk_sizes(2000, 256, 0, keys)
    assert sizes[0] == 256 and sizes == sorted(sizes[:-1], reverse=True) + sizes[-1:]
    assert len(sizes) == 18  # 8 chunks of 256 would make the last cost about 3 first chunks
    assert min(balanced_chunk_sizes(100_000, 256, 0, keys)[:-1]) == 256 // SMALLEST_CHUNK_DIVISOR
    assert balanced_chunk_sizes(2000, 256, 1500, keys)[0] < 256  # a cached prefix is attended to as well


def test_a_chunk_beside_a_decode_step_leaves_it_room() -> None:
    keys = model_keys_per_token(TINY)
    assert keys is not None
    full, half = balanced_chunk_sizes(2000, 256, 0, keys), balanced_chunk_sizes(2000, 256, 0, keys, 0.5)
    assert 128 <= half[0] <= 140 < full[0]  # half the cost: a little over half the tokens (attention is quadratic)
    assert len(half) > len(full)
    assert balanced_chunk_sizes(2000, 256, 500, None, 0.5) == chunk_sizes(1500, 128)
    for room in (0.0, 1.5):
        with pytest.raises(ValueError, match="room"):
            balanced_chunk_sizes(2000, 256, 0, keys, room)


def test_matmul_bound_models_and_unknown_shapes_take_even_chunks() -> None:
    assert min(balanced_chunk_sizes(2000, 256, 0, 1e12)[:-1]) >= 255  # attention is noise beside the matmuls
    assert balanced_chunk_sizes(2000, 256, 500, None) == chunk_sizes(1500, 256)
    assert balanced_chunk_sizes(1, 256, 0, 768.0) == []


def test_keys_per_token_from_a_config() -> None:
    qwen3 = {**TINY, "hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64}
    assert model_keys_per_token({**qwen3, "intermediate_size": 2048}) == keys_per_token(768, 12, 4, 64, 2048)
    assert model_keys_per_token({k: v for k, v in TINY.items() if k != "num_key_value_heads"}) == keys_per_token(
        256, 4, 4, 64, 768
    )
    assert model_keys_per_token({k: v for k, v in TINY.items() if k != "intermediate_size"}) is None  # MoE shapes
    assert model_keys_per_token({}) is None


@pytest.mark.parametrize(
    ("case", "world", "choice", "alone", "cached", "room", "expected_path"),
    [
        ("alone on several ranks: overlapped, in a lone task's chunks", 2, "auto", True, 0, 1.0, "pipeline"),
        ("alone on one rank", 1, "auto", True, 0, 1.0, "sequential"),
        ("beside others: its chunks ride their steps", 2, "auto", False, 0, 0.8, "sequential"),
        ("a cached prefix: the rest rides the steps", 2, "auto", True, 500, 1.0, "sequential"),
        ("forced sequential alone", 2, "sequential", True, 0, 1.0, "sequential"),
    ],
)
def test_a_newcomer_takes_a_lone_tasks_path_only_alone(
    case: str, world: int, choice: PathChoice, alone: bool, cached: int, room: float, expected_path: str
) -> None:
    keys = model_keys_per_token(TINY)
    path, sizes = newcomer_prefill(2000, 256, world, choice, alone=alone, cached=cached, keys=keys, room=room)
    step = effective_step(256, world)
    assert path == expected_path, case
    if path == "pipeline":
        assert sizes == chunk_sizes(2000, step), case
    else:
        assert sizes == balanced_chunk_sizes(2000, step, cached, keys, room), case
