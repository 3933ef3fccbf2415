"""Sides are measured in rounds whose order rotates, and sample i of every side is from round i."""

from __future__ import annotations

from collections.abc import Callable

from bench.rounds import rotated, run_rounds


def test_the_order_rotates_by_one_side_per_round() -> None:
    assert [rotated(["a", "b"], i) for i in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    assert rotated([], 3) == []


def test_run_rounds_interleaves_the_sides_and_pairs_their_samples() -> None:
    calls: list[str] = []

    def side(name: str) -> Callable[[], str]:
        def measure() -> str:
            calls.append(name)
            return f"{name}{sum(1 for c in calls if c == name)}"

        return measure

    samples = run_rounds({"a": side("a"), "b": side("b")}, 3)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert samples == {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3"]}
