from __future__ import annotations

import itertools

import pytest

from events.fold import fold
from services.master.capacity import ModelFacts
from services.master.placement import (
    NodeCount,
    PlacementError,
    PlacementRequest,
    model_slug,
    plan_instance,
    split_layers,
)
from tests.events.builders import Events


@pytest.mark.parametrize(
    ("layers", "weights", "expected"),
    [
        (8, [1, 1], [(0, 4), (4, 8)]),
        (8, [3, 1], [(0, 6), (6, 8)]),
        (8, [1, 1, 1], [(0, 3), (3, 6), (6, 8)]),
        (8, [100, 1], [(0, 7), (7, 8)]),  # at least one layer on the small node
        (2, [1, 1], [(0, 1), (1, 2)]),
        (5, [0, 0], [(0, 3), (3, 5)]),  # unknown memory counts as equal
        (8, [16], [(0, 8)]),
    ],
)
def test_split_layers_in_proportion_to_memory(layers: int, weights: list[int], expected: list[tuple[int, int]]) -> None:
    ranges = split_layers(layers, weights)
    assert ranges == expected
    assert ranges[0][0] == 0 and ranges[-1][1] == layers
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_more_nodes_than_layers_is_an_error() -> None:
    with pytest.raises(PlacementError, match="fewer than"):
        split_layers(2, [1, 1, 1])


def _request(least: int = 1) -> PlacementRequest:
    facts = ModelFacts(layers=8, weight_bytes=1 << 20)
    return PlacementRequest(model="tiny", facts=facts, count=NodeCount(least=least), base_port=5000)


def test_plan_uses_free_ports_per_host_and_stable_ids() -> None:
    ev = Events()
    state = fold(enumerate([ev.node("n1"), ev.node("n2"), ev.placed("i1")], start=1))
    plan = plan_instance(state, _request(least=2))
    # i1 holds 127.0.0.1:5000 and :5001, so the new ranks take the next free ones
    assert plan.ring_hosts == ["127.0.0.1:5002", "127.0.0.1:5003"]
    assert [s.rank for s in plan.shards] == [0, 1]
    assert plan.instance_id == f"inst-{model_slug('tiny')}-1"  # i1 was the first tiny instance


def test_plan_with_no_nodes_says_what_to_do() -> None:
    with pytest.raises(PlacementError, match="shoal worker"):
        plan_instance(fold([]), _request())


def test_model_slug_is_a_subject_token() -> None:
    slug = model_slug("/models/mlx-community/Llama-3.2-1B-Instruct-4bit/")
    assert "." not in slug and "/" not in slug and slug.startswith("Llama-3-2-1B")
