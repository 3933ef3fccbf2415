"""The master's catalog answers from look-ups done off its event loop (services/master/model_lookup.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.master.capacity import ModelFacts
from services.master.core import UnknownModel
from services.master.model_lookup import LookedUpCatalog

EIGHT = ModelFacts(layers=8, weight_bytes=1 << 20)


class CountingCatalog:
    """A catalog that records which thread asked it, and fails `owner/flaky` until told not to."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, bool]] = []
        self.flaky_ok = False

    def facts_of(self, model: str) -> ModelFacts:
        self.asked.append((model, threading.current_thread() is threading.main_thread()))
        if model == "owner/flaky" and not self.flaky_ok:
            raise UnknownModel("owner/flaky: config.json could not be fetched")
        if model not in ("tiny", "owner/flaky"):
            raise UnknownModel(f"unknown model {model!r}")
        return EIGHT


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_served_models_are_looked_up_in_a_thread_and_answered_from_memory() -> None:
    inner = CountingCatalog()
    catalog = LookedUpCatalog(inner, ["tiny", "owner/flaky"], clock=Clock())
    asyncio.run(catalog.look_up())
    assert sorted(inner.asked) == [("owner/flaky", False), ("tiny", False)]  # never on the loop's thread
    assert catalog.facts_of("tiny") == EIGHT
    with pytest.raises(UnknownModel, match="could not be fetched"):
        catalog.facts_of("owner/flaky")
    assert len(inner.asked) == 2  # answered from what was found


def test_a_failed_look_up_is_tried_again_only_when_due() -> None:
    inner, clock = CountingCatalog(), Clock()
    catalog = LookedUpCatalog(inner, ["tiny", "owner/flaky"], retry_seconds=30, clock=clock)
    asyncio.run(catalog.look_up())
    inner.flaky_ok = True
    clock.now = 29
    asyncio.run(catalog.look_up(only_due=True))
    assert len(inner.asked) == 2
    clock.now = 30
    asyncio.run(catalog.look_up(only_due=True))
    assert inner.asked[2:] == [("owner/flaky", False)]  # the good one is never asked again
    assert catalog.facts_of("owner/flaky") == EIGHT


def test_a_model_never_looked_up_is_unknown() -> None:
    inner = CountingCatalog()
    catalog = LookedUpCatalog(inner, ["tiny"])
    with pytest.raises(UnknownModel, match="was not looked up"):
        catalog.facts_of("other")
