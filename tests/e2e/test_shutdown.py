"""Stopping `shoal up` (Ctrl-C) while clients are being served: each stream in flight ends with an
error event that says the server is shutting down, then [DONE]; a request not streamed gets a 503
with Retry-After; no traceback is logged; and the log holds each task's cancel, reason `shutdown`,
so the cluster started again on the same data reads those tasks as cancelled, not running.

A task that ended on its own before the stop keeps its ordinary end (its client got the whole
answer), so the requests here must not end on their own: the EOS is banned (the tiny model's
greedy answer to some prompts ends within tens of tokens; not to these here, but a machine that
rounds otherwise may differ) and max_tokens is far more than the tokens made before the stop."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import Cluster, Proc, shoal_argv
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.helpers import eos_banned, wait_running

pytestmark = pytest.mark.timeout(240)

LONG = 2000  # tokens: far more than the seconds the test takes to stop the cluster


def _stream(base_url: str, index: int, bias: dict[str, int], first_chunk: threading.Event, out: dict[str, Any]) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"story {index}"}],
        "max_tokens": LONG,
        "logit_bias": bias,
        "stream": True,
    }
    events: list[str] = []
    out["events"] = events
    try:
        with (
            httpx.Client(base_url=base_url, timeout=60) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            out["status"] = r.status_code
            out["task_id"] = r.headers.get("x-shoal-task-id")
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first_chunk.set()
    except httpx.HTTPError as exc:  # told by the assertions on `out`, not as a thread's traceback
        out["error"] = repr(exc)


def _answer(base_url: str, bias: dict[str, int], out: dict[str, Any]) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "a long answer"}],
        "max_tokens": LONG,
        "logit_bias": bias,
    }
    try:
        with httpx.Client(base_url=base_url, timeout=60) as http:
            response = http.post("/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:  # told by the assertions on `out`, not as a thread's traceback
        out["error"] = repr(exc)
        return
    out.update(status=response.status_code, headers=dict(response.headers), body=response.json())


def test_stopping_tells_every_client_and_cancels_every_task(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, workers=1, **E2E_SETTINGS).wait_ready()
    try:
        bias = eos_banned(cluster.env)
        streams = [{} for _ in range(2)]
        started = [threading.Event() for _ in streams]
        threads = [
            threading.Thread(target=_stream, args=(cluster.base_url, i, bias, started[i], streams[i]), daemon=True)
            for i in range(len(streams))
        ]
        answer: dict[str, Any] = {}
        threads.append(threading.Thread(target=_answer, args=(cluster.base_url, bias, answer), daemon=True))
        for thread in threads:
            thread.start()
        # the first data line is the role's chunk, sent when the task is published, not when it runs
        assert all(event.wait(60) for event in started), "the streams never started"
        with cluster.http() as http:
            wait_running(http, "tiny", len(threads))  # the request not streamed is in flight too
        stopped_at = time.monotonic()
        assert cluster.up.stop(signal.SIGINT, grace=60) == 0, cluster.up.tail()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive(), "a client was left waiting after the server stopped"
        assert time.monotonic() - stopped_at < 30
        for stream in streams:
            assert stream.get("status") == 200 and stream["events"][-1:] == ["[DONE]"], stream
            last = json.loads(stream["events"][-2])
            # an ordinary finish here is a task that ended before the stop: which way (length, stop) is in it
            assert "error" in last, (
                f"stream ended on its own before the stop, after {len(stream['events'])} events: {last}"
            )
            assert last["error"]["code"] == "server_shutting_down", last
            assert "shutting down" in last["error"]["message"] and last["error"]["type"] == "server_error"
        assert answer.get("status") == 503, answer
        assert answer["body"]["error"]["code"] == "server_shutting_down"
        assert int(answer["headers"]["retry-after"]) > 0
        assert "Traceback" not in cluster.up.tail(200_000)

        # the same cluster again, on the same data: the tasks the stop interrupted were cancelled
        argv = shoal_argv(
            "up", "--workers", "1", "--nats-port", str(cluster.nats_port), "--port", str(cluster.api_port)
        )
        cluster.up = Proc("up-again", argv, cluster.env, tmp_path)
        cluster.wait_ready()
        with cluster.http() as http:
            for stream in streams:
                task = http.get(f"/v1/tasks/{stream['task_id']}").json()
                assert task["status"] == "cancelled" and task["cancel_reason"] == "shutdown", task
    finally:
        cluster.stop()
