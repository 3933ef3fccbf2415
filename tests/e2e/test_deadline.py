"""The request deadline on a real `shoal up` cluster: a request still decoding after
`request_timeout_seconds` gets 504 saying so, its task is stored as failed with that error, and
its ranks stop it (the next request is served, not queued behind a task nobody waits for)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.helpers import eos_banned

DEADLINE_S = 3
pytestmark = pytest.mark.timeout(240)


def test_a_request_past_its_deadline_gets_504_and_its_ranks_let_it_go(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, workers=2, request_timeout_seconds=str(DEADLINE_S)).wait_ready()
    try:
        with cluster.http() as http:
            # it ends by the deadline, never by an early EOS of the tiny model's greedy answer
            long = {
                "model": "tiny",
                "messages": [{"role": "user", "content": "a long story"}],
                "max_tokens": 4000,
                "logit_bias": eos_banned(cluster.env),
            }
            started = time.monotonic()
            response = http.post("/v1/chat/completions", json=long, timeout=120)
            waited = time.monotonic() - started
            error = response.json()["error"]
            assert response.status_code == 504, response.text
            assert error["code"] == "request_timeout"
            assert error["message"] == f"request timed out after {DEADLINE_S} s (request_timeout_seconds)"
            assert DEADLINE_S <= waited < DEADLINE_S + 5  # the master's watchdog ticks every 0.5 s
            task = http.get(f"/v1/tasks/{response.headers['x-shoal-task-id']}").json()
            assert (task["status"], task["error"]) == ("failed", error["message"])

            # Not behind the timed-out task: held behind its 4,000 tokens, the same deadline would
            # have failed this one too (a 504); its 200 says it ended within the deadline, judged by
            # the cluster's own clock rather than by a bound on this loaded machine's wall time.
            short = {**long, "max_tokens": 4}
            assert http.post("/v1/chat/completions", json=short, timeout=120).status_code == 200
    finally:
        cluster.stop()
