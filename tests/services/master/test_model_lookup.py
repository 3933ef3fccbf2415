"""The master's catalog answers from look-ups done off its event loop (services/master/model_lookup.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.master.core import UnknownModel
from services.master.model_lookup import LookedUpCatalog


class CountingCatalog:
    """A catalog that records which thread asked it, and fails `owner/flaky` until told not to."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, bool]] = []
        self.flaky_ok = False

    def layers_of(self, model: str) -> int:
        self.asked.append((model, threading.current_thread() is threading.main_thread()))
        if model == "owner/flaky" and not self.flaky_ok:
            raise UnknownModel("owner/flaky: config.json could not be fetched")
        if model not in ("tiny", "owner/flaky"):
            raise UnknownModel(f"unknown model {model!r}")
        return 8


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
    assert catalog.layers_of("tiny") == 8
    with pytest.raises(UnknownModel, match="could not be fetched"):
        catalog.layers_of("owner/flaky")
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
    assert catalog.layers_of("owner/flaky") == 8


def test_a_model_not_served_is_asked_directly() -> None:
    inner = CountingCatalog()
    catalog = LookedUpCatalog(inner, ["tiny"])
    with pytest.raises(UnknownModel, match="unknown model 'other'"):
        catalog.layers_of("other")
