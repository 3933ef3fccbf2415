"""`settle_heap`: what a process holds when it is ready is left out of later full collections."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from runner.heap import settle_heap

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the test process goes on collecting as before


def test_what_was_loaded_is_frozen_and_what_comes_after_is_collected(unfrozen: None) -> None:
    loaded = [[i] for i in range(50_000)]  # lists are always tracked: stands for a model's libraries
    settle_heap()
    assert gc.get_freeze_count() >= len(loaded)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in loaded[:100])  # a full collection walks none of them

    class Cycle:
        me: object = None

    made_later = Cycle()
    made_later.me = made_later  # garbage only a collection frees
    assert id(made_later) in {id(o) for o in gc.get_objects()}
    del made_later
    assert gc.collect() >= 1  # the collector still frees what was made after settling
