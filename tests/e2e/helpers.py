"""What several end-to-end tests need: the 1-rank reference output, task state, long prompts."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.cluster import Cluster, long_prompt, runner_log_tails, shoal_argv
from runner.models.tiny import TinySpec, tiny_dir

__all__ = [
    "eos_banned",
    "long_prompt",
    "one_rank_text",
    "story_on_failure",
    "task_state",
    "wait_running",
    "wait_task_ended",
]


def one_rank_text(env: dict[str, str], prompt: str, max_tokens: int, prefill_step: int = 64) -> str:
    """`shoal generate --ranks 1`: what the cluster must produce greedily for the same prompt."""
    argv = shoal_argv(
        "generate",
        "--model",
        "tiny",
        "--ranks",
        "1",
        "--prompt",
        prompt,
        "--max-tokens",
        str(max_tokens),
        "--prefill-step",
        str(prefill_step),
        "--json",
    )
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    return str(json.loads(out)["text"])


def task_state(http: httpx.Client, task_id: str) -> dict[str, Any]:
    response = http.get(f"/v1/tasks/{task_id}")
    response.raise_for_status()
    return response.json()


def wait_task_ended(http: httpx.Client, task_id: str, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = task_state(http, task_id)
        if state["status"] in ("completed", "cancelled", "failed"):
            return state
        time.sleep(0.1)
    raise TimeoutError(f"task {task_id} did not end within {timeout}s: {task_state(http, task_id)}")


def eos_banned(env: dict[str, str]) -> dict[str, int]:
    """The `logit_bias` that keeps the tiny model of the cluster run with `env` from ever choosing
    its EOS. Its random weights make the greedy answer (chat's default) to some prompts end at an
    EOS after a few dozen tokens (`story 2` after 55), and a prompt that does not here may on a
    machine that rounds otherwise: a test that needs a task still running when it acts (a stop, a
    cancel, a deadline) bans the EOS, so its task ends only by what the test does or by max_tokens."""
    model_dir = tiny_dir(Path(env["SHOAL_DATA_DIR"]) / "models", TinySpec())
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    return {str(token): -100 for token in (eos if isinstance(eos, list) else [eos])}


def wait_running(http: httpx.Client, model: str, count: int, timeout: float = 60.0) -> None:
    """Until `count` tasks of `model` are in prefill or decode, as the API's /metrics tells."""
    deadline = time.monotonic() + timeout
    running = 0
    while time.monotonic() < deadline:
        running = _running(http.get("/metrics").text, model)
        if running >= count:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{running} task(s) of {model!r} running after {timeout}s, not {count}")


def _running(metrics: str, model: str) -> int:
    for family in text_string_to_metric_families(metrics):
        if family.name == "shoal_num_requests_running":
            return sum(int(s.value) for s in family.samples if s.labels.get("model") == model)
    return 0


def serve_cluster(root: Path, workers: int) -> Iterator[Cluster]:
    """A ready cluster for a module fixture to `yield from`; stopped when the module is done."""
    running = Cluster(root, workers=workers)
    try:
        yield running.wait_ready()
    finally:
        running.stop()


@contextlib.contextmanager
def story_on_failure(cluster: Cluster) -> Iterator[None]:
    """For a test on a cluster that outlives it (a module's): the log's story (`Cluster.story`)
    printed beside the failure, since the cluster's own report comes only when it stops."""
    try:
        yield
    except BaseException:
        runners = "\n".join(runner_log_tails(cluster.root / "data", newest=2, chars=1500))
        print(f"{runners}\n--- the log at the failure\n{cluster.story(60)}", file=sys.stderr)
        raise
