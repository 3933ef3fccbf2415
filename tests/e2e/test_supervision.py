"""Issue 9, supervision, in real clusters:
- a service that crashes is restarted with backoff while the API next to it keeps answering;
- a rank frozen while loading (SHOAL_TEST_FAULT `freeze:1:load`) makes the waiting task fail within
  the loading deadline, and `shoal diagnose` names the ranks still loading;
- `shoal up` stopped with Ctrl-C while a rank loads, three times, leaves no "failed to load N
  times" lock-out: the next start places the model and serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from loguru import logger

from eventlog.log import EventLog
from events.catalogue import InstancePlaced, NodeJoined, Origin
from events.ids import NodeId
from events.stamp import Stamper
from services.api.auth import ApiAccess
from services.config import resolve_config
from services.credentials import endpoint_for
from services.master.capacity import ModelFacts
from services.master.service import Master, MasterSettings
from services.models import LocalModelCatalog
from services.nats import EmbeddedNats
from services.nats_permissions import Identity
from services.roles import master_policy, run_api
from services.supervise import Backoff, supervise
from tests.e2e.cluster import Cluster, free_port, shoal_argv
from tests.e2e.conftest import E2E_SETTINGS

READY_S = 15.0  # the loading deadline of the frozen-rank cluster
# The deadline runs from the newest sign of loading (a rank's `loading` status): starting the two
# runner processes (importing MLX) takes up to ~20 s on this loaded 2-core machine, then the
# watchdog tick and master -> log -> API -> client. A real hang never ends, far outside this bound.
MARGIN_S = 40.0


class CatalogThatFailsOnce:
    """The real catalog, except that its first answer is an error no rule expects (a disk that
    failed a read): the master's decide raises, as a bug in one event would make it."""

    def __init__(self) -> None:
        self.real = LocalModelCatalog()
        self.calls = 0

    def facts_of(self, model: str) -> ModelFacts:
        self.calls += 1
        if self.calls == 1:
            raise OSError("reading the model's config.json failed")
        return self.real.facts_of(model)


@pytest.mark.timeout(60)
async def test_a_crashed_master_is_restarted_while_the_api_keeps_answering(
    event_log: EventLog, nats_url: str, tmp_path: Path
) -> None:
    del event_log  # fresh streams
    port = free_port()
    env = {"SHOAL_NATS_URL": nats_url, "SHOAL_API_PORT": str(port), "SHOAL_MODELS": "tiny"}
    resolved = resolve_config(env={**env, "SHOAL_DATA_DIR": str(tmp_path)})
    catalog = CatalogThatFailsOnce()
    settings = MasterSettings(
        nats=endpoint_for(resolved.config, Identity("master")), policy=master_policy(resolved.config)
    )
    warnings: list[str] = []
    sink = logger.add(lambda message: warnings.append(str(message)), level="WARNING")
    quick = Backoff(initial_seconds=0.5)
    log = await EventLog.connect(nats_url, name="test")
    api_ready = asyncio.Event()
    api = asyncio.create_task(supervise("API", lambda: run_api(resolved, ApiAccess(), api_ready), backoff=quick))
    master = asyncio.create_task(supervise("master", Master(settings, catalog).run, backoff=quick))
    try:
        await api_ready.wait()
        await asyncio.sleep(0.5)
        joined = NodeJoined(  # a worker's announcement: the master places the default model, and crashes
            env=Stamper(Origin(service="worker", node="n1")).stamp(),
            node_id=NodeId("n1"),
            host="127.0.0.1",
            cores=2,
            memory_bytes=1 << 30,
            backend="cpu",
            version="t",
        )
        await log.append(joined)
        answers = await _poll_healthz(port, until=lambda: catalog.calls >= 2, timeout=20)
        placed = await _placed(log)
    finally:
        for service in (api, master):
            service.cancel()
        await asyncio.gather(api, master, return_exceptions=True)
        logger.remove(sink)
        await log.close()
    assert any("master is degraded: OSError" in w and "restarting in 0.5s" in w for w in warnings), warnings
    assert answers and all(status == 200 for status in answers), answers  # the API never went down
    assert placed and placed[0].model == "tiny"  # the restarted master placed the model


@pytest.mark.timeout(60)
async def test_healthz_says_degraded_with_503_while_the_api_cannot_reach_its_log(
    make_nats: Callable[..., EmbeddedNats], tmp_path: Path
) -> None:
    server = await anyio.to_thread.run_sync(make_nats("outage").start)
    streams = await EventLog.connect(server.url, ensure=False)
    await streams.ensure_streams()
    await streams.close()
    port = free_port()
    env = {"SHOAL_NATS_URL": server.url, "SHOAL_API_PORT": str(port), "SHOAL_MODELS": "tiny"}
    resolved = resolve_config(env={**env, "SHOAL_DATA_DIR": str(tmp_path)})
    ready = asyncio.Event()
    api = asyncio.create_task(supervise("API", lambda: run_api(resolved, ApiAccess(), ready)))
    try:
        await ready.wait()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            assert (await http.get("/healthz")).status_code == 200
            await anyio.to_thread.run_sync(server.stop)
            outage = await _healthz_until(http, 503)
            assert outage["status"] == "degraded" and "NATS" in outage["degraded"], outage
            await anyio.to_thread.run_sync(server.start)
            healed = await _healthz_until(http, 200)
            assert healed["degraded"] == "" and healed["status"] != "degraded", healed
    finally:
        api.cancel()
        await asyncio.gather(api, return_exceptions=True)


async def _healthz_until(http: httpx.AsyncClient, status: int, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        response = await http.get("/healthz")
        if response.status_code == status:
            return response.json()
        last = response.status_code
        await asyncio.sleep(0.1)
    raise TimeoutError(f"/healthz never answered {status} within {timeout}s (last: {last!r})")


async def _poll_healthz(port: int, *, until: Callable[[], bool], timeout: float) -> list[int]:
    statuses: list[int] = []
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        while time.monotonic() < deadline:
            statuses.append((await http.get("/healthz")).status_code)
            if until():
                break
            await asyncio.sleep(0.05)
    return statuses


async def _placed(log: EventLog, timeout: float = 15.0) -> list[InstancePlaced]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        placed = [e async for _seq, e in log.replay(from_seq=1) if isinstance(e, InstancePlaced)]
        if placed:
            return placed
        await asyncio.sleep(0.2)
    return []


def _nodes_up(cluster: Cluster, count: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{cluster.base_url}/healthz", timeout=5).json()["nodes_up"] >= count:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{count} nodes not up within {timeout}s:\n{cluster.up.tail()}")


@pytest.mark.timeout(180)
def test_a_rank_frozen_while_loading_fails_the_waiting_task_within_the_deadline(tmp_path: Path) -> None:
    fault = {"SHOAL_TEST_FAULT": "freeze:1:load"}
    cluster = Cluster(tmp_path, workers=2, env=fault, instance_ready_timeout_seconds=str(READY_S), **E2E_SETTINGS)
    try:
        _nodes_up(cluster, 2)
        started = time.monotonic()
        with pytest.raises(openai.APIError) as failed:
            cluster.client(timeout=READY_S + MARGIN_S + 30).chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
        seconds = time.monotonic() - started
        assert seconds < READY_S + MARGIN_S, seconds
        assert f"not ready within {READY_S:g}s" in str(failed.value) and "rank 1" in str(failed.value)
        env = {**cluster.env, "SHOAL_NATS_URL": cluster.nats_url}
        out = subprocess.run(
            shoal_argv("diagnose", "--nats-url", cluster.nats_url, "--json"),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 1, out.stderr
        findings = json.loads(out.stdout)["findings"]
        timed_out = [f for f in findings if f["cause"] == "load_timed_out"]
        assert timed_out, json.dumps(findings, indent=1)
        assert 1 in timed_out[0]["stuck_ranks"] and "still loading" in timed_out[0]["summary"]
        frozen, waiting = (next(r for r in timed_out[0]["ranks"] if r["rank"] == rank) for rank in (1, 0))
        assert frozen["runner_status"] in ("placed", "loading"), frozen  # it may freeze before its report is out
        # its heartbeats stopped when it froze (None: it froze before its first one was stored);
        # rank 0's went on (it waits in the ring's set-up)
        assert waiting["heartbeat_ago_s"] is not None, waiting
        frozen_ago = frozen["heartbeat_ago_s"]
        assert frozen_ago is None or frozen_ago > waiting["heartbeat_ago_s"] + 5, (frozen, waiting)
    finally:
        cluster.stop()


@pytest.mark.timeout(300)
def test_stops_while_loading_leave_no_lock_out(tmp_path: Path) -> None:
    """The issue's three Ctrl-Cs while rank 1 loads (rank 0 waits in the ring's accept, which the
    shutdown interrupts: `Accept failed (error: 4)`), on one data dir; then a start that serves."""
    slow_load = {"SHOAL_TEST_FAULT": "sleep:1:load:120"}
    for attempt in range(3):
        cluster = Cluster(tmp_path, workers=2, env=slow_load, **E2E_SETTINGS)
        try:
            _nodes_up(cluster, 2)
            _wait_for(lambda c=cluster: len(c.runner_pids()) >= 2, f"attempt {attempt}: runners started")
            time.sleep(2)  # rank 0 into the ring's accept, rank 1 asleep in its load
        finally:
            cluster.stop()
    cluster = Cluster(tmp_path, workers=2, env={}, **E2E_SETTINGS)
    try:
        cluster.wait_ready(timeout=150)
        answer = cluster.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert "failed to load" not in cluster.up.tail(20_000)
    finally:
        cluster.stop()


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise TimeoutError(what)


@pytest.mark.timeout(180)
def test_shoal_up_starts_its_nats_again_when_it_dies_and_serves_on(tmp_path: Path) -> None:
    """The embedded nats-server killed (OOM killer, a stray `kill -9`): `shoal up` starts it again
    on the same port and store, every service reconnects, and the same request gets the same
    answer; before, the services retried a dead port until Ctrl-C, which then hung."""
    cluster = Cluster(tmp_path, workers=1, env={}, **E2E_SETTINGS)
    try:
        cluster.wait_ready(150)
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}
        before = cluster.client().chat.completions.create(**ask).choices[0].message.content
        (killed,) = cluster.nats_pids()
        os.kill(killed, signal.SIGKILL)
        _wait_for(lambda: cluster.nats_pids() not in ([], [killed]), "nats-server started again", timeout=30)
        _wait_for(lambda: _healthz_ok(cluster), "healthz ok after the restart", timeout=60)
        after = cluster.client().chat.completions.create(**ask).choices[0].message.content
        assert after == before
        assert "the embedded nats-server exited (code -9)" in cluster.up.tail(200_000)
        started = time.monotonic()
        assert cluster.up.stop(signal.SIGHUP, grace=30) == 0  # its terminal closed: a clean stop too
        assert time.monotonic() - started < 30
        assert cluster.nats_pids() == []  # the server stopped with it
    finally:
        cluster.stop()


def _healthz_ok(cluster: Cluster) -> bool:
    try:
        return httpx.get(f"{cluster.base_url}/healthz", timeout=5).json()["status"] == "ok"
    except (httpx.HTTPError, ValueError, KeyError):
        return False
