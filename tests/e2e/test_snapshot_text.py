"""The master folds no chunks, yet the snapshots it writes keep every task's text: a service
that starts from one (the API's hub, `shoal replay`) has what a fold of the whole log gives.
A real `shoal up` whose master snapshots every few events."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from eventlog.log import EventLog
from events.ids import TaskId
from events.state import State
from tests.e2e.cluster import Cluster

WRITTEN = re.compile(r"snapshot of the State written at seq (\d+)")


async def _fold_from_snapshot(cluster: Cluster) -> State:
    log = await EventLog.connect(cluster.admin_endpoint(), name="snapshot-test", ensure=False)
    try:
        return await log.fold(from_snapshot=True)
    finally:
        await log.close()


def _snapshot_covering(cluster: Cluster, seq: int, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        written = [int(s) for s in WRITTEN.findall(cluster.up.tail(200_000))]
        if written and max(written) >= seq:
            return max(written)
        time.sleep(0.2)
    raise AssertionError(f"no snapshot covering seq {seq} within {timeout}s")


@pytest.mark.timeout(240)
def test_a_snapshot_written_by_the_master_keeps_the_streamed_text(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, workers=1, snapshot_every_events="20")
    try:
        cluster.wait_ready(180)
        with cluster.http() as http:
            body = {"model": "tiny", "messages": [{"role": "user", "content": "tell me about stones"}]}
            response = http.post("/v1/chat/completions", json={**body, "max_tokens": 80})
            answer, task_id = response.json(), TaskId(response.headers["x-shoal-task-id"])
            text, tokens = answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]
            task = http.get(f"/v1/tasks/{task_id}").json()
        assert tokens > 20 and text  # more chunks than the snapshot interval, or the test proves little
        full = asyncio.run(_fold_from_snapshot(cluster))
        ended = full.tasks[task_id].ended_seq
        _snapshot_covering(cluster, ended)
        from_snapshot = asyncio.run(_fold_from_snapshot(cluster)).tasks[task_id]
        assert from_snapshot.text == text and from_snapshot.completion_tokens == tokens
        assert task["status"] == "completed"
    finally:
        cluster.stop()
