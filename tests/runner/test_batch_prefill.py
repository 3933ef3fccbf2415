"""Which of a step's prompt chunks run in one forward (pure; the forwards are in test_group_batch)."""

from __future__ import annotations

import pytest

from runner.engine.batch_prefill import ChunkWork, prefill_groups

pytestmark = pytest.mark.timeout(10)


def work(*chunks: tuple[int, bool]) -> list[ChunkWork]:
    return [ChunkWork(list(range(length)), fresh) for length, fresh in chunks]


@pytest.mark.parametrize(
    ("case", "chunks", "expected"),
    [
        ("nothing", [], []),
        ("one alone", [(5, True)], [(0,)]),
        ("fresh chunks of one length together", [(5, True), (5, True), (5, True)], [(0, 1, 2)]),
        (
            "one forward per length, at its first member's place",
            [(5, True), (3, True), (5, True), (3, True)],
            [(0, 2), (1, 3)],
        ),
        ("a chunk that is not a prompt's first runs alone", [(5, True), (5, False), (5, True)], [(0, 2), (1,)]),
    ],
)
def test_prefill_groups(case: str, chunks: list[tuple[int, bool]], expected: list[tuple[int, ...]]) -> None:
    assert prefill_groups(work(*chunks)) == expected, case
