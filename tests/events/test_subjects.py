"""`event_subjects_without`: a consumer filter that leaves out exactly the kinds asked for.

JetStream cannot exclude subjects, so the filter lists the kept ones; a kind added to the catalogue
and missing here would silently never reach a service that follows with it, hence these checks.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings

from events.catalogue import AnyEvent, ChunkGenerated, LogEvent, PrefillProgress
from events.subjects import TASK_EVENTS, event_subjects_without, subject_for
from tests.events.strategies import event_strategy
from tests.events.test_codec import _kinds  # pyright: ignore[reportPrivateUsage]
from tests.security.test_bus_permissions import matches


@settings(max_examples=400)
@given(event_strategy())
def test_every_log_event_not_skipped_matches_exactly_one_filter(event: AnyEvent) -> None:
    if type(event) not in _kinds(LogEvent):
        return
    subject = subject_for(event)
    for skipped in ((), (ChunkGenerated,), (ChunkGenerated, PrefillProgress)):
        hits = [pattern for pattern in event_subjects_without(*skipped) if matches(pattern, subject)]
        assert len(hits) == (0 if type(event) in skipped else 1), (subject, hits)


def test_the_filters_are_disjoint_as_jetstream_requires() -> None:
    patterns = event_subjects_without(ChunkGenerated)
    for a, b in itertools.combinations(patterns, 2):
        assert not matches(a, b.replace("*", "x")) and not matches(b, a.replace("*", "x")), (a, b)


def test_task_events_are_every_kind_on_a_task_subject() -> None:
    on_task = {kind for kind in _kinds(LogEvent) if "task_id" in kind.__struct_fields__}
    assert set(TASK_EVENTS) == on_task
