"""Issue 5's hang catalogue: each hang injected into a real cluster, then `shoal diagnose` on its log.

For every case the client gets an error within the stall deadline (measured from the injection),
the task ends `failed` in the log, and `shoal diagnose` names the rank and the cause — live
(`--nats-url`) and offline on the exported file (`shoal events export --telemetry`), the latter
in a fresh process with no SHOAL_* environment whose sockets cannot connect anywhere.

Clusters (module-scoped, shared between cases that the cluster survives; after a failure the
master retires the instance and places a new one, and each case first waits for it):
- `shoal up`: SIGKILL rank 1 mid-prefill, SIGKILL rank 0 mid-decode, SIGSTOP rank 1 mid-prefill.
- `shoal up` with SHOAL_TEST_FAULT: rank 1 sleeps inside prefill iteration 2 of its first task.
  (Its own cluster: every runner process of rank 1 would sleep in its first task.)
- separate services: one `shoal worker` SIGSTOPped until its node times out.
- `shoal up --model DIR` where DIR has a config.json but no weights: nothing can be placed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.cluster import Cluster, shoal_argv
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.helpers import long_prompt, task_state
from tests.e2e.processes import runner_nodes, runner_pids
from tests.e2e.test_failures import Services

STALL_S = float(E2E_SETTINGS["task_stall_seconds"])
NODE_TIMEOUT_S = float(E2E_SETTINGS["node_timeout_seconds"])
# The watchdog ticks about once a second, then the failure goes master -> log -> API -> client;
# on this shared 2-core machine (load ~5) each hop can take seconds. 10 s of slack keeps a real
# hang (which never ends) far outside the bound while not failing on a slow tick.
MARGIN_S = 10.0
DEADLINE_S = STALL_S + MARGIN_S
STACK_AFTER_S = 2  # SHOAL_STALL_STACK_SECONDS: heartbeats carry the stack once a phase is this old
FLIGHT = {"SHOAL_STALL_STACK_SECONDS": str(STACK_AFTER_S)}

pytestmark = pytest.mark.timeout(240)


# --- clusters ------------------------------------------------------------------------------------


def _healthy(base_url: str, *, timeout: float = 120.0, instances: int = 1) -> None:
    """Wait for `/healthz`: a node up and (if `instances`) a ready instance."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(f"{base_url}/healthz", timeout=10).json()
            if last["nodes_up"] >= 1 and last["ready_instances"] >= instances:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{base_url} not healthy within {timeout}s: {last}")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("up"), workers=2, env=FLIGHT, **E2E_SETTINGS)
    try:
        yield cluster.wait_ready()
    finally:
        cluster.stop()
        _resume_all(cluster)


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    fault = {"SHOAL_TEST_FAULT": "sleep:1:3:60", **FLIGHT}  # rank 1, poll 3 = prefill iteration 2
    cluster = Cluster(tmp_path_factory.mktemp("sleepy"), workers=2, env=fault, **E2E_SETTINGS)
    try:
        yield cluster.wait_ready()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    running = Services(tmp_path_factory.mktemp("services"))
    try:
        running.wait_ready()
        yield running
    finally:
        for proc in running.procs.values():
            _signal(proc.process.pid, signal.SIGCONT)
        running.stop()


@pytest.fixture(scope="module")
def unplaceable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("unplaceable")
    model = root / "weightless"
    model.mkdir()
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "vocab_size": 256}
    (model / "config.json").write_text(json.dumps(config))
    cluster = Cluster(root, workers=1, env={}, models=str(model), **E2E_SETTINGS)
    try:
        _healthy(cluster.base_url, instances=0)
        yield cluster
    finally:
        cluster.stop()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _resume_all(cluster: Cluster) -> None:
    for pid in cluster.runner_pids().values():
        _signal(pid, signal.SIGCONT)


# --- one hang: drive a task, inject, time the error -------------------------------------------------


@dataclass
class Outcome:
    task_id: str
    instance_id: str | None
    error: str
    seconds_to_error: float  # from the injection


def run_and_inject(
    client: openai.OpenAI,
    http: httpx.Client,
    *,
    model: str = "tiny",
    prompt: str,
    max_tokens: int,
    when: str,  # "progress": mid-prefill; "content": mid-decode; "now": before any chunk
    inject: Callable[[str | None], None],
) -> Outcome:
    """Stream one task; at the first chunk of kind `when`, `inject(instance_id)`; return the error."""
    injected_at: float | None = None
    instance: str | None = None
    with client.chat.completions.with_streaming_response.create(  # pyright: ignore[reportCallIssue]
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_progress": True},  # pyright: ignore[reportArgumentType]  # shoal's extension
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        if when == "now":
            injected_at = time.monotonic()
            inject(None)
        try:
            for chunk in response.parse():
                if injected_at is not None:
                    continue
                progress = getattr(chunk, "prompt_progress", None)
                content = chunk.choices and chunk.choices[0].delta.content
                if (when == "progress" and progress) or (when == "content" and content):
                    instance = task_state(http, task_id)["instance_id"]
                    injected_at = time.monotonic()
                    inject(instance)
        except openai.APITimeoutError:
            raise AssertionError(f"task {task_id}: the client hung until its own timeout") from None
        except openai.APIError as exc:
            assert injected_at is not None, f"task {task_id} failed before the injection: {exc}"
            return Outcome(task_id, instance, str(exc), time.monotonic() - injected_at)
    raise AssertionError(f"task {task_id} ended without an error (injected: {injected_at is not None})")


def make_client(base_url: str) -> openai.OpenAI:
    # A read timeout past the deadline: a hang shows up as APITimeoutError, never as a stuck test.
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="shoal", timeout=DEADLINE_S + 30, max_retries=0)


# --- the verdicts: live, exported, offline -----------------------------------------------------------


@dataclass
class Verdicts:
    live: dict[str, Any]  # the task's finding from `diagnose --nats-url`
    offline: dict[str, Any]  # the same from `diagnose --file` in a process without NATS
    export: Path


# Runs `shoal diagnose` with every socket connect refused: proof the offline path needs no NATS.
NO_NETWORK = (
    "import socket, sys\n"
    "def refuse(*args, **kwargs):\n"
    "    raise OSError('network disabled for the offline diagnosis')\n"
    "socket.socket.connect = refuse\n"
    "socket.socket.connect_ex = refuse\n"
    "socket.create_connection = refuse\n"
    "from services.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _diagnosis(out: subprocess.CompletedProcess[str], task_id: str, where: str) -> dict[str, Any]:
    assert out.returncode == 1, f"{where}: diagnose exit {out.returncode} (1 = findings)\n{out.stdout}\n{out.stderr}"
    findings = [f for f in json.loads(out.stdout)["findings"] if f.get("task_id") == task_id]
    assert len(findings) == 1, f"{where}: findings for {task_id}: {json.dumps(findings, indent=1)}"
    return findings[0]


def diagnose_everywhere(cluster: Cluster | Services, task_id: str, root: Path) -> Verdicts:
    nats_url = cluster.nats_url
    env = {**cluster.env, "SHOAL_NATS_URL": nats_url}  # its data dir: the admin identity its server made
    export = root / f"export-{task_id}.jsonl"
    live = subprocess.Popen(
        shoal_argv("diagnose", "--nats-url", nats_url, "--json"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    exported = subprocess.run(
        shoal_argv("events", "export", "--telemetry", "-o", str(export)),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exported.returncode == 0, exported.stderr
    stdout, stderr = live.communicate(timeout=120)
    live_finding = _diagnosis(subprocess.CompletedProcess(live.args, live.returncode, stdout, stderr), task_id, "live")

    clean = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    offline = subprocess.run(
        [sys.executable, "-c", NO_NETWORK, "diagnose", "--file", str(export), "--json"],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    return Verdicts(live=live_finding, offline=_diagnosis(offline, task_id, "offline"), export=export)


def task_events(export: Path, task_id: str) -> list[dict[str, Any]]:
    events = [json.loads(line)["event"] for line in export.read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("task_id") == task_id and e["type"] != "runner_heartbeat"]


def check(outcome: Outcome, verdicts: Verdicts, *, cause: str, stuck: list[int], error_says: str, root: Path) -> None:
    report = {"outcome": outcome.__dict__, "live": verdicts.live, "offline": verdicts.offline}
    (root / f"report-{outcome.task_id}.json").write_text(json.dumps(report, indent=1, default=str))
    print(
        json.dumps(
            {
                "task": outcome.task_id,
                "error": outcome.error,
                "s": round(outcome.seconds_to_error, 2),
                "live": [verdicts.live["cause"], verdicts.live["stuck_ranks"]],
                "offline": [verdicts.offline["cause"], verdicts.offline["stuck_ranks"]],
            }
        )
    )
    assert outcome.seconds_to_error < DEADLINE_S, outcome
    assert error_says in outcome.error, outcome
    # The first terminal event decides (a rank still running on a retired instance may finish later).
    terminal = [e["type"] for e in task_events(verdicts.export, outcome.task_id) if e["type"] in TERMINAL]
    assert terminal and terminal[0] == "task_failed", terminal
    for where, finding in (("live", verdicts.live), ("offline", verdicts.offline)):
        assert finding["status"] == "failed", (where, finding)
        assert (finding["cause"], finding["stuck_ranks"]) == (cause, stuck), (where, json.dumps(finding, indent=1))
        assert finding["next_step"].strip(), (where, finding)
    # Offline is the same diagnosis as live, from the file alone.
    assert _comparable(verdicts.live) == _comparable(verdicts.offline)


TERMINAL = ("task_failed", "task_completed")


def _comparable(finding: dict[str, Any]) -> dict[str, Any]:
    return {k: finding.get(k) for k in ("cause", "stuck_ranks", "summary", "next_step", "status", "instance_id")}


def _rank_view(finding: dict[str, Any], rank: int) -> dict[str, Any]:
    return next(v for v in finding["ranks"] if v["rank"] == rank)


# --- the catalogue -----------------------------------------------------------------------------------


def test_sigkill_one_rank_mid_prefill(up: Cluster, tmp_path: Path) -> None:
    _healthy(up.base_url)
    with up.http() as http:
        outcome = run_and_inject(
            make_client(up.base_url),
            http,
            prompt=long_prompt(600),
            max_tokens=20,
            when="progress",
            inject=lambda instance: os.kill(up.runner_pids()[(str(instance), 1)], signal.SIGKILL),
        )
    verdicts = diagnose_everywhere(up, outcome.task_id, tmp_path)
    check(outcome, verdicts, cause="rank_died", stuck=[1], error_says="rank 1", root=tmp_path)


def test_sigkill_one_rank_mid_decode(up: Cluster, tmp_path: Path) -> None:
    _healthy(up.base_url)
    with up.http() as http:
        outcome = run_and_inject(
            make_client(up.base_url),
            http,
            prompt="Tell me about the river",
            max_tokens=2000,
            when="content",
            inject=lambda instance: os.kill(up.runner_pids()[(str(instance), 0)], signal.SIGKILL),
        )
    verdicts = diagnose_everywhere(up, outcome.task_id, tmp_path)
    check(outcome, verdicts, cause="rank_died", stuck=[0], error_says="rank 0", root=tmp_path)


def test_sigstop_one_rank_mid_prefill(up: Cluster, tmp_path: Path) -> None:
    _healthy(up.base_url)
    stopped: list[int] = []

    def freeze(instance: str | None) -> None:
        stopped.append(up.runner_pids()[(str(instance), 1)])
        os.kill(stopped[0], signal.SIGSTOP)

    try:
        with up.http() as http:
            outcome = run_and_inject(
                make_client(up.base_url),
                http,
                prompt=long_prompt(600),
                max_tokens=20,
                when="progress",
                inject=freeze,
            )
        verdicts = diagnose_everywhere(up, outcome.task_id, tmp_path)
    finally:  # resumed after the test (the worker has usually killed it by then: its instance was retired)
        for pid in stopped:
            _signal(pid, signal.SIGCONT)
    # Frozen, not dead: no exit was reported, its heartbeats just stopped (`rank_died` covers both).
    check(outcome, verdicts, cause="rank_died", stuck=[1], error_says="stalled", root=tmp_path)
    for finding in (verdicts.live, verdicts.offline):
        assert "no exit" in finding["next_step"], finding
    # The flight recorder: the surviving rank, blocked on the frozen one, reported its stack.
    for finding in (verdicts.live, verdicts.offline):
        survivor = _rank_view(finding, 0)
        assert survivor["stack"] and "File " in survivor["stack"], survivor


def test_rank_sleeping_inside_a_prefill_iteration(sleepy: Cluster, tmp_path: Path) -> None:
    _healthy(sleepy.base_url)
    with sleepy.http() as http:
        outcome = run_and_inject(
            make_client(sleepy.base_url),
            http,
            prompt=long_prompt(600),
            max_tokens=20,
            when="progress",
            inject=lambda instance: None,  # the fault is armed at start; the first progress starts the clock
        )
    verdicts = diagnose_everywhere(sleepy, outcome.task_id, tmp_path)
    check(outcome, verdicts, cause="stalled_in_compute", stuck=[1], error_says="stalled", root=tmp_path)
    for finding in (verdicts.live, verdicts.offline):
        sleeper, survivor = _rank_view(finding, 1), _rank_view(finding, 0)
        assert sleeper["stack"] and "faults.py" in sleeper["stack"], sleeper
        assert survivor["stack"] and "collectives.py" in survivor["stack"], survivor


def test_worker_whose_heartbeats_stop(services: Services, tmp_path: Path) -> None:
    """SIGSTOP the host of the task's last rank — its `shoal worker` and the runners on it, as a
    machine that swaps or is paused: the node's heartbeats stop, the master times the node out
    and retires the instance on it, well before the stall deadline. (Freezing the worker alone
    left the outcome to a race: the tiny model's greedy answer may end at an early EOS, before
    the node timeout. With separate services the master places as soon as one node joined, so the
    instance may have one rank or two: the test asks the runner processes which node hosts which
    rank.)"""
    base_url = f"http://127.0.0.1:{services.api_port}"
    frozen: list[tuple[str, list[int], int]] = []  # (node, its ranks, worker pid)

    def freeze_worker(instance: str | None) -> None:
        ranks = {rank: node for (inst, rank), node in runner_nodes(services.nats_url).items() if inst == instance}
        node = ranks[max(ranks)]
        pid = services.procs[f"worker{node.removeprefix('n')}"].process.pid
        frozen.append((node, sorted(r for r, n in ranks.items() if n == node), pid))
        os.kill(pid, signal.SIGSTOP)
        for runner in runner_pids(services.nats_url, node):
            frozen.append((node, [], runner))
            os.kill(runner, signal.SIGSTOP)

    try:
        with httpx.Client(base_url=base_url, timeout=30) as http:
            outcome = run_and_inject(
                make_client(base_url),
                http,
                prompt=long_prompt(600),
                max_tokens=2000,
                when="progress",
                inject=freeze_worker,
            )
        verdicts = diagnose_everywhere(services, outcome.task_id, tmp_path)
    finally:
        for _, _, pid in frozen:
            _signal(pid, signal.SIGCONT)
    node, ranks, _ = frozen[0]
    check(outcome, verdicts, cause="node_timed_out", stuck=ranks, error_says=f"node {node}", root=tmp_path)


def test_task_for_a_model_that_cannot_be_placed(unplaceable: Cluster, tmp_path: Path) -> None:
    model = str(unplaceable.root / "weightless")
    with unplaceable.http() as http:
        outcome = run_and_inject(
            make_client(unplaceable.base_url),
            http,
            model=model,
            prompt="hello",
            max_tokens=5,
            when="now",
            inject=lambda instance: None,
        )
    verdicts = diagnose_everywhere(unplaceable, outcome.task_id, tmp_path)
    check(outcome, verdicts, cause="never_assigned", stuck=[], error_says="cannot be loaded", root=tmp_path)
    for finding in (verdicts.live, verdicts.offline):
        assert "cannot be loaded" in finding["summary"], finding
