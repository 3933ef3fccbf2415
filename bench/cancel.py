"""`shoal bench cancel`: how fast a cancel stops every rank, against the prefill chunk time.

`shoal up --workers 2`, then `--cancels` requests with a long prompt, each cancelled through
`POST /v1/tasks/{id}/cancel` after a random number of prefill chunks. From the log: the time
from `TaskCancelled` to the last rank's `RunnerStatusChanged(ready)` for that task (every rank
idle), and the median time between the last rank's `PrefillProgress` events (one chunk).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.cluster import Cluster, long_prompt
from eventlog.log import EventLog
from events.catalogue import LogEvent, PrefillProgress, RunnerStatusChanged, TaskCancelled, TaskCompleted, TaskFailed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cancels", type=int, default=50, help="cancelled requests (default 50)")
    parser.add_argument(
        "--prompt-words", type=int, default=400, help="prompt length in words (~5 tokens each with the tiny tokenizer)"
    )
    parser.add_argument("--prefill-step", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    prompt = long_prompt(args.prompt_words)
    with tempfile.TemporaryDirectory(prefix="shoal-bench-cancel-") as root:
        cluster = Cluster(Path(root), workers=2, prefill_step_size=str(args.prefill_step), log_level="WARNING")
        try:
            cluster.wait_ready(timeout=300)
            outcomes = [_cancel_once(cluster, prompt, rng) for _ in range(args.cancels)]
            events = asyncio.run(_read_log(cluster.nats_url))
        finally:
            cluster.stop()
    return _report(args, outcomes, events)


def _cancel_once(cluster: Cluster, prompt: str, rng: random.Random) -> dict[str, Any]:
    """Stream a request; after a random number of progress chunks, cancel it; read to the end."""
    client = cluster.client(timeout=120)
    cancel_after = rng.randint(1, 8)
    seen = 0
    task_id = ""
    started = time.monotonic()
    with (
        client.chat.completions.with_streaming_response.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=4,
            stream=True,
            extra_body={"shoal_progress": True},
        ) as response,
        httpx.Client(base_url=cluster.base_url, timeout=30) as http,
    ):
        task_id = response.headers["x-shoal-task-id"]
        finish = None
        for chunk in response.parse():
            progress = (chunk.model_extra or {}).get("prompt_progress")
            if progress and progress["processed"] > 0:
                seen += 1
                if seen == cancel_after:
                    http.post(f"/v1/tasks/{task_id}/cancel")
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = (chunk.model_extra or {}).get("shoal_finish_reason")
    return {"task_id": task_id, "finish": finish, "after_chunks": cancel_after, "seconds": time.monotonic() - started}


async def _read_log(url: str) -> list[LogEvent]:
    log = await EventLog.connect(url, name="shoal-bench-cancel")
    try:
        return [event async for _seq, event in log.replay()]
    finally:
        await log.close()


def _report(args: argparse.Namespace, outcomes: list[dict[str, Any]], events: list[LogEvent]) -> dict[str, Any]:
    cancelled_at: dict[str, int] = {}
    idle_at: dict[str, dict[int, int]] = {}
    chunk_gaps: list[float] = []
    last_progress: dict[str, int] = {}
    ended: dict[str, str] = {}
    for event in events:
        match event:
            case TaskCancelled():
                cancelled_at.setdefault(event.task_id, event.env.wall_time)
            case RunnerStatusChanged(status="ready", detail=task_id) if task_id:
                idle_at.setdefault(task_id, {})[event.rank] = event.env.wall_time
            case PrefillProgress(rank=1, processed=processed) if processed > 0:
                previous = last_progress.get(event.task_id)
                if previous is not None:
                    chunk_gaps.append((event.env.wall_time - previous) / 1e6)
                last_progress[event.task_id] = event.env.wall_time
            case TaskCompleted() | TaskFailed():
                ended[event.task_id] = event.finish_reason if isinstance(event, TaskCompleted) else "failed"
            case _:
                pass
    latencies = sorted(
        (max(idle_at[t].values()) - cancelled_at[t]) / 1e6
        for t in cancelled_at
        if t in idle_at and len(idle_at[t]) == 2
    )
    hangs = [o["task_id"] for o in outcomes if ended.get(o["task_id"]) not in ("cancelled", "stop", "length")]
    chunk_ms = statistics.median(chunk_gaps) if chunk_gaps else 0.0
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))] if latencies else float("nan")
    return {
        "bench": "cancel",
        "ranks": 2,
        "cancels": len(outcomes),
        "cancelled_in_prefill": sum(1 for o in outcomes if ended.get(o["task_id"]) == "cancelled"),
        "measured": len(latencies),
        "hangs": len(hangs),
        "chunk_ms": round(chunk_ms, 1),
        "cancel_to_idle_ms": {
            "p50": round(statistics.median(latencies), 1) if latencies else None,
            "p99": round(p99, 1),
            "max": round(latencies[-1], 1) if latencies else None,
        },
        "p99_within_target": bool(latencies) and p99 <= chunk_ms + 50,
        "target": "p99 <= chunk_ms + 50 ms, zero hangs",
    }
