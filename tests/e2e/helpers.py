"""What several end-to-end tests need: the 1-rank reference output, task state, long prompts."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.cluster import Cluster, long_prompt, shoal_argv

__all__ = ["long_prompt", "one_rank_text", "task_state", "wait_task_ended"]


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


def serve_cluster(root: Path, workers: int) -> Iterator[Cluster]:
    """A ready cluster for a module fixture to `yield from`; stopped when the module is done."""
    running = Cluster(root, workers=workers)
    try:
        yield running.wait_ready()
    finally:
        running.stop()
