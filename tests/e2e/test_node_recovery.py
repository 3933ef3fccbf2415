"""Liveness that recovers, on a real cluster of separate services (`shoal nats|master|api` and
standalone workers): a worker frozen past the node timeout is timed out, comes back by itself
and serves the next request; a worker whose clock runs an hour slow is never timed out."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.processes import runner_pids
from tests.e2e.test_failures import Services

pytestmark = pytest.mark.timeout(240)

NODE_TIMEOUT_S = float(E2E_SETTINGS["node_timeout_seconds"])
PROMPT = "Tell me about the river"


def health(services: Services) -> dict[str, Any]:
    return httpx.get(f"http://127.0.0.1:{services.api_port}/healthz", timeout=5).json()


def wait_health(services: Services, ok: Callable[[dict[str, Any]], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = health(services)
        if ok(last):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout}s; /healthz says {last}\n" + services.procs["master"].tail(2000))


def answer(services: Services) -> str:
    completion = services.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=8
    )
    return completion.choices[0].message.content or ""


def node_events(services: Services) -> list[tuple[str, str]]:
    """(kind, join cause) of every node event in the log, in order."""
    events = [record["event"] for record in services.export()]
    return [(e["type"], str(e.get("cause", ""))) for e in events if str(e["type"]).startswith("node_")]  # pyright: ignore[reportIndexIssue, reportAttributeAccessIssue, reportUnknownArgumentType, reportUnknownMemberType]


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def test_a_worker_frozen_past_the_node_timeout_comes_back_and_serves(tmp_path: Path) -> None:
    """SIGSTOP a standalone worker and its runners (a host that swaps, a paused VM) for longer than
    the node timeout: the master times the node out (no node up: requests are refused); on SIGCONT
    the worker folds its own timeout, announces the node again, the default model is placed again
    and the next request gets the same answer as before."""
    services = Services(tmp_path, workers=1)
    try:
        services.wait_ready()
        before = answer(services)
        frozen = [services.procs["worker0"].process.pid, *runner_pids(services.nats_url, "n0")]
        for pid in frozen:
            _signal(pid, signal.SIGSTOP)
        try:
            wait_health(services, lambda h: h["nodes_up"] == 0, "node n0 timed out", NODE_TIMEOUT_S + 20)
        finally:
            for pid in frozen:
                _signal(pid, signal.SIGCONT)
        wait_health(services, lambda h: h["nodes_up"] == 1 and h["ready_instances"] >= 1, "node n0 back", 90)
        assert answer(services) == before
        kinds = node_events(services)
        timed_out = kinds.index(("node_timed_out", ""))
        assert ("node_joined", "timed_out") in kinds[timed_out:], kinds
        assert kinds.count(("node_timed_out", "")) == 1, kinds
    finally:
        for proc in services.procs.values():
            _signal(proc.process.pid, signal.SIGCONT)
        services.stop()


def skewed_worker(node: str) -> list[str]:
    return [sys.executable, "-m", "tests.e2e.skewed_worker", "--node-id", node, "--skew-seconds", "-3600"]


def test_a_worker_whose_clock_runs_an_hour_slow_is_never_timed_out(tmp_path: Path) -> None:
    """Its heartbeats carry wall times an hour old: judged by the sender's clock the node would
    time out within one timeout; judged by arrival it stays up and serves."""
    services = Services(tmp_path, workers=1, worker_argv=skewed_worker)
    try:
        services.wait_ready()
        watched_until = time.monotonic() + 2.5 * NODE_TIMEOUT_S
        while time.monotonic() < watched_until:
            assert health(services)["nodes_up"] == 1, services.procs["master"].tail(2000)
            time.sleep(0.5)
        assert answer(services)
        kinds = node_events(services)
        assert ("node_timed_out", "") not in kinds and kinds[0] == ("node_joined", "start"), kinds
    finally:
        services.stop()
