"""Live tokens per second per instance (`services.api.dashboard_rates`): the tokens the fold counted
over a sliding window of chunk stamps, on the sampling rank's clock advanced by the reader's own."""

from __future__ import annotations

import msgspec
import pytest

from events.catalogue import ChunkGenerated, InstanceRetired, LogEvent, TaskCompleted, Usage
from events.fold import apply_live
from events.ids import InstanceId, TaskId
from events.state import State
from services.api.dashboard_rates import WINDOW_S, TokenRates
from tests.events.builders import Events

SKEW_NS = 3_600 * 1_000_000_000  # the runner's clock an hour ahead of anything the reader has


class Folding:
    """Folds events into a State and the rates, the reader's monotonic clock set by hand."""

    def __init__(self) -> None:
        self.ev = Events()
        self.state = State()
        self.rates = TokenRates()
        self.now = 100.0  # the reader's monotonic clock (s)

    def fold(self, *events: LogEvent) -> None:
        for event in events:
            before = self.state
            self.state, error = apply_live(before, before.last_seq + 1, event)
            assert error is None, error
            self.rates.observe(before, self.state, event, self.now)

    def chunk(self, task: str, tokens: int, at_s: float) -> ChunkGenerated:
        """A chunk of `tokens` stamped `at_s` after the start, on a runner clock far from ours."""
        chunk = self.ev.chunk(task, tokens=tokens)
        env = msgspec.structs.replace(chunk.env, wall_time=SKEW_NS + int(at_s * 1e9))
        return msgspec.structs.replace(chunk, env=env)


@pytest.fixture
def cluster() -> Folding:
    folding = Folding()
    ev = folding.ev
    folding.fold(ev.node("n1"), ev.node("n2"), ev.placed("i1", ("n1", "n2")), ev.placed("i2", ("n1",)))
    for task, instance in (("a", "i1"), ("b", "i1"), ("c", "i2")):
        folding.fold(ev.created(task), ev.assigned(task, instance), ev.started(task, 0))
    return folding


def test_an_instance_rate_is_its_batchs_tokens_in_the_window_over_the_window(cluster: Folding) -> None:
    # two tasks decoding on i1 (10 tokens each per second), one on i2 (4 per second), for 10 s
    for tenth in range(100):
        at = tenth / 10
        cluster.now = 100.0 + at
        cluster.fold(cluster.chunk("a", 1, at), cluster.chunk("b", 1, at))
        if tenth % 5 == 0:
            cluster.fold(cluster.chunk("c", 2, at))
    assert cluster.rates.rates(cluster.now) == {"i1": 20.0, "i2": 4.0}


def test_a_rate_falls_to_zero_one_window_after_the_last_chunk_whatever_the_clocks(cluster: Folding) -> None:
    for tenth in range(30):
        cluster.now = 100.0 + tenth / 10
        cluster.fold(cluster.chunk("a", 1, tenth / 10))
    last = cluster.now
    assert cluster.rates.rates(last) == {"i1": 30 / WINDOW_S}  # 3 s of the window filled
    assert cluster.rates.rates(last + 1.0) == {"i1": 30 / WINDOW_S}  # nothing left the window yet
    assert cluster.rates.rates(last + 3.05) == {"i1": 20 / WINDOW_S}  # its first second left it
    assert cluster.rates.rates(last + WINDOW_S) == {}


def test_a_backlog_folded_late_counts_at_the_times_its_tokens_were_made(cluster: Folding) -> None:
    cluster.now = 500.0  # the reader folds 10 s of chunks at once, long after
    cluster.fold(*(cluster.chunk("a", 1, tenth / 10) for tenth in range(100)))
    assert cluster.rates.rates(500.0) == {"i1": 10.0}  # the last window's 50 tokens, not all 100


def test_a_chunk_after_its_task_ended_and_a_retired_instance_count_nothing(cluster: Folding) -> None:
    ev = cluster.ev
    cluster.fold(cluster.chunk("a", 4, 0.0), cluster.chunk("c", 4, 0.0))
    done = TaskCompleted(env=ev.task_rank("a").stamp(), task_id=TaskId("a"), finish_reason="stop", usage=Usage())
    cluster.fold(done, cluster.chunk("a", 50, 0.1))  # a late chunk of an ended task: the fold counts none
    cluster.fold(InstanceRetired(env=ev.master.stamp(), instance_id=InstanceId("i2"), reason="idle", cause="idle"))
    assert cluster.rates.rates(cluster.now) == {"i1": 4 / WINDOW_S}
