"""A streaming client gives up on a connection that a partition left silent (issue 46): the chaos
run's client, streaming from the real API across network-namespace hosts, while the API's host has
its cable pulled. Before, its read timeout was its whole bound (in a chaos run, the run itself), so
such a call waited that long; now it ends once it heard nothing, not even one of the API's
keepalives, for its silence — and the task the client left is not lost: it ends on the log."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bench.chaos_check import ClientRecord
from bench.chaos_client import send
from bench.chaos_schedule import RequestSpec
from bench.netcluster import NetCluster
from events.ids import TaskId
from services.config import ShoalConfig
from tests.netns.checker import read_tasks

pytestmark = pytest.mark.timeout(600)  # the module's cluster starts in the first test's time

KEEPALIVE_S = ShoalConfig().sse_keepalive_seconds  # the cluster's: it sets none
SILENCE = 2.5 * KEEPALIVE_S  # a few intervals: a waiting stream hears a keepalive well within it
BOUND = 4 * SILENCE  # what the call may take in all (a chaos run's: the whole run)


class Streaming(threading.Thread):
    """The chaos client's streamed call on a thread; `opened` once the response's head came (the
    API took the task), `record` once the call ended."""

    def __init__(self, cluster: NetCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.opened = threading.Event()
        self.record: ClientRecord | None = None

    def run(self) -> None:
        with self.cluster.http(timeout=BOUND) as http:
            http.event_hooks["response"] = [lambda _response: self.opened.set()]
            spec = RequestSpec(number=1, key=0, kind="stream", prompt_words=3, max_tokens=2000)
            self.record = send(http, spec, bound=BOUND, clock=time.monotonic, silence=SILENCE)


def test_a_stream_a_partition_left_silent_ends_within_its_silence_and_its_task_is_not_lost(
    cluster: NetCluster,
) -> None:
    call = Streaming(cluster)
    call.start()
    assert call.opened.wait(60), (call.record, cluster.tails())  # 2000 tokens to come: it is under way
    cut = time.monotonic()
    cluster.net.partition("control")  # the API's host: the client hears nothing more from it
    try:
        call.join(BOUND + 10)
    finally:
        cluster.net.heal("control")
    record = call.record
    assert record is not None, "the client is still waiting"
    assert record.outcome == "silent", record
    assert record.error == f"connection silent for {SILENCE:g}s (not even a keepalive)"
    assert record.ended - cut < BOUND / 2, (record.ended - cut, record)  # its silence, not its bound
    task = TaskId(record.task_id)
    deadline = time.monotonic() + 120  # the master's stall deadline and a recovery, at most
    while not (tasks := asyncio.run(read_tasks(cluster.admin_endpoint())))[task].ended:
        assert time.monotonic() < deadline, f"task {task} never ended on the log: {tasks[task]}\n{cluster.tails()}"
        time.sleep(1.0)
    assert tasks[task].text.startswith(record.text)
