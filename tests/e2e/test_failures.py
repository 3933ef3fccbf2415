"""Failures a real cluster must survive without a hang: a runner killed mid-task, and the
master restarted mid-stream (nothing decided twice)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from eventlog.export import read_export
from services.ops.delivery import delivery_problems
from services.ops.scan import scan
from tests.e2e.cluster import Cluster, Proc, free_port, free_ring_base_port, shoal_argv
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.helpers import long_prompt, one_rank_text, wait_task_ended

pytestmark = pytest.mark.timeout(300)

PROMPT = "Tell me about the river"


def wait_new_ready_instance(http: httpx.Client, old: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = http.get("/healthz").json()
        if health["ready_instances"] >= 1:
            return
        time.sleep(0.2)
    raise TimeoutError(f"no instance replaced {old} within {timeout}s")


def test_killing_a_runner_mid_task_fails_the_task_and_the_instance_is_replaced(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, workers=2, **E2E_SETTINGS).wait_ready()
    try:
        client = cluster.client()
        victim = cluster.runner_pids()[(cluster.instance_id, 1)]
        started = time.monotonic()
        with (
            pytest.raises(openai.APIError) as failure,
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": long_prompt(600)}],
                max_tokens=50,
                stream=True,
                stream_options={"include_progress": True},  # pyright: ignore[reportArgumentType]
            ) as stream,
        ):
            for chunk in stream:
                if getattr(chunk, "prompt_progress", None) and victim:
                    os.kill(victim, signal.SIGKILL)
                    victim = 0
        elapsed = time.monotonic() - started
        assert elapsed < float(E2E_SETTINGS["task_stall_seconds"]) + 10
        assert "rank" in str(failure.value) or "retired" in str(failure.value)
        with cluster.http() as http:
            wait_new_ready_instance(http, cluster.instance_id)
        completion = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=8
        )
        assert completion.choices[0].message.content == one_rank_text(cluster.env, PROMPT, 8)
    finally:
        cluster.stop()


def shoal_worker(node: str) -> list[str]:
    return shoal_argv("worker", "--node-id", node)


class Services:
    """The cluster as separate processes: `shoal nats`, `shoal master`, 2 workers, `shoal api`.
    `worker_argv` makes each worker's command line from its node id."""

    def __init__(self, root: Path, *, workers: int = 2, worker_argv: Callable[[str], list[str]] = shoal_worker) -> None:
        self.root = root
        nats_port, self.api_port = free_port(), free_port()
        self.nats_url = f"nats://127.0.0.1:{nats_port}"
        self.env = {
            **os.environ,
            "SHOAL_DATA_DIR": str(root / "data"),
            "SHOAL_NATS_URL": self.nats_url,
            "SHOAL_NATS_PORT": str(nats_port),
            "SHOAL_RING_BASE_PORT": str(free_ring_base_port()),
            "SHOAL_API_PORT": str(self.api_port),
            **{f"SHOAL_{k.upper()}": v for k, v in E2E_SETTINGS.items()},
        }
        self.procs: dict[str, Proc] = {}
        self.start("nats", "nats", "--nodes", ",".join(f"n{i}" for i in range(workers)))
        self.procs["nats"].wait_for_line(re.compile("JetStream at"), 30)
        self.start("master", "master")
        for i in range(workers):
            self.procs[f"worker{i}"] = Proc(f"worker{i}", worker_argv(f"n{i}"), self.env, root)
        self.start("api", "api")

    def start(self, name: str, *args: str) -> Proc:
        self.procs[name] = Proc(name, shoal_argv(*args), self.env, self.root)
        return self.procs[name]

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.api_port}/v1", api_key="x", timeout=60, max_retries=0)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.api_port}/healthz").json()["ready_instances"] >= 1:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(
            "cluster of separate services never got ready:\n" + "\n".join(p.tail(1500) for p in self.procs.values())
        )

    def export(self) -> list[dict[str, object]]:
        out = self.root / "export.jsonl"
        Proc("export", shoal_argv("events", "export", "-o", str(out)), self.env, self.root).process.wait(60)
        return [json.loads(line) for line in out.read_text().splitlines() if line]

    def stop(self) -> None:
        for name in ("api", "worker0", "worker1", "master", "nats"):
            if name in self.procs:
                self.procs[name].stop()


@pytest.fixture
def services_without_workers(tmp_path: Path) -> Iterator[Services]:
    running = Services(tmp_path, workers=0)
    try:
        _wait_http(f"http://127.0.0.1:{running.api_port}/healthz")
        yield running
    finally:
        running.stop()


def _wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(f"{url} never answered")


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    running = Services(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def test_restarting_the_master_mid_stream_finishes_the_stream_and_decides_nothing_twice(services: Services) -> None:
    services.wait_ready()
    client = services.client()
    parts: list[str] = []
    with client.chat.completions.with_streaming_response.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=60, stream=True
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        for chunk in response.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                if len(parts) == 3:
                    services.procs["master"].stop(signal.SIGKILL)
                    services.start("master", "master")
    assert len(parts) > 3
    with httpx.Client(base_url=f"http://127.0.0.1:{services.api_port}") as http:
        assert wait_task_ended(http, task_id)["status"] == "completed"
    after = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=8)
    assert after.choices[0].message.content
    time.sleep(1.0)  # let the restarted master fold the tail
    records = services.export()
    kinds = Counter(r["event"]["type"] for r in records)  # pyright: ignore[reportIndexIssue]
    assigned = Counter(r["event"]["task_id"] for r in records if r["event"]["type"] == "task_assigned")  # pyright: ignore[reportIndexIssue]
    assert kinds["instance_placed"] == 1, kinds
    assert assigned and set(assigned.values()) == {1}, assigned
    assert kinds["task_created"] == kinds["task_completed"] + kinds["task_failed"]
    exported = read_export(services.root / "export.jsonl")
    events = [(r.seq, r.event) for r in exported if r.stream == "events"]
    state = scan(enumerate(exported, 1)).state
    assert delivery_problems(events, state, {task_id: "".join(parts)}) == []  # the stream got the log's text


def test_ctrl_c_stops_shoal_up_leaving_no_process(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, workers=2, **E2E_SETTINGS).wait_ready()
    runners = list(cluster.runner_pids().values())
    assert len(runners) == 2
    code = cluster.up.stop(signal.SIGINT, grace=30)
    assert code == 0, cluster.up.tail()
    assert "shoal: stopped" in cluster.up.tail()
    for pid in runners:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    leftovers = [p for p in Path("/proc").glob("[0-9]*/cmdline") if cluster.nats_url.split(":")[-1] in _read(p)]
    assert leftovers == []


def test_no_worker_means_503_not_a_hang(services_without_workers: Services) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{services_without_workers.api_port}", timeout=30) as http:
        response = http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        )
        ready, live = http.get("/readyz"), http.get("/livez")
        message = http.post(
            "/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        )
    assert response.status_code == 503
    assert "shoal worker" in response.json()["error"]["message"]
    assert ready.status_code == 503 and ready.json()["status"] == "no_workers" and not ready.json()["ready"]
    assert "shoal worker" in ready.json()["reason"]
    assert (live.status_code, live.json()) == (200, {"status": "ok"})  # the process answers: nothing to restart
    assert message.status_code == 503 and message.json()["error"]["type"] == "overloaded_error"


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""


@pytest.fixture
def one_worker(tmp_path: Path) -> Iterator[Services]:
    running = Services(tmp_path, workers=1)
    try:
        yield running
    finally:
        running.stop()


def test_a_worker_stopped_by_its_service_manager_says_it_left(one_worker: Services) -> None:
    """systemd and docker stop with SIGTERM (a closed terminal's SIGHUP is handled the same, as in
    `shoal up`): the worker stops as on Ctrl-C and records `NodeLeft`, so the master does not wait
    for its node timeout to know (before: the process ended on the spot, and its node stayed "up"
    until the timeout)."""
    one_worker.wait_ready()
    assert one_worker.procs["worker0"].stop(signal.SIGTERM, grace=30) == 0, one_worker.procs["worker0"].tail()
    left = [r["event"] for r in one_worker.export() if r["event"]["type"] == "node_left"]  # pyright: ignore[reportIndexIssue]
    assert [(e["node_id"], e["reason"]) for e in left] == [("n0", "shutdown")], left  # pyright: ignore[reportIndexIssue]
