"""`shoal bench kv`: a burst of long requests, the KV unbounded against `kv_cache_bytes`.

Per round, one `shoal up --workers 1` per side, started afresh so each runner's peak resident
memory (`VmHWM`) is this burst's: `--requests` concurrent chats of `--prompt-words` words (the tiny
model's tokenizer spends ~5 tokens a word) with `max_tokens` `--max-tokens`, once with
`kv_cache_bytes` 0 (half the memory available: nothing waits here) and once with `--kv-bytes`. The
prefix cache is off on both sides, so what a finished row leaves behind does not count. Measured:
the runner's peak memory over its memory once ready, the burst's wall time (the price of running
fewer at once) and the answers (every request served on both sides).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.cluster import Cluster, long_prompt
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.serve_sides import model_dir
from bench.stats import compare, summarize, target

ABOUT = "a burst of long requests on 1 worker: runner peak memory and wall time, KV unbounded vs kv_cache_bytes"
SIZED = (
    Sized("--rounds", 2, 1, "bursts per side (each on a fresh cluster)"),
    Sized("--requests", 12, 4, "concurrent requests per burst"),
    Sized("--prompt-words", 280, 60, "words per prompt (~5 tiny-model tokens each)"),
    Sized("--max-tokens", 300, 32, "tokens each request may generate"),
    Sized("--kv-bytes", 64 << 20, 16 << 20, "kv_cache_bytes of the bounded side"),
)
SIDES = ("unbounded", "bounded")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds each cluster may take to start")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED)
    bursts: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-kv-") as root:
        directory = model_dir("tiny", Path(root) / "data")
        for index in range(int(settings["rounds"])):
            for side in SIDES if index % 2 == 0 else SIDES[::-1]:
                kv = int(settings["kv_bytes"]) if side == "bounded" else 0
                home = Path(root) / f"{side}-{index}"
                home.mkdir()
                bursts[side].append(_burst(home, str(directory), kv, settings, args.ready_timeout))
    return _report(settings, bursts, quick=bool(args.quick))


def _burst(home: Path, model: str, kv_bytes: int, settings: dict[str, Any], ready_timeout: float) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        cluster = Cluster(
            home, workers=1, models=model, kv_cache_bytes=str(kv_bytes), prefix_cache_bytes="0", log_level="WARNING"
        )
        stack.callback(cluster.stop)
        cluster.wait_ready(ready_timeout)
        runners = list(cluster.runner_pids().values())
        ready = sum(_status_bytes(pid, "VmRSS") for pid in runners)
        started = time.monotonic()
        answers = asyncio.run(_requests(cluster.base_url, model, settings))
        wall = time.monotonic() - started
        peak = sum(_status_bytes(pid, "VmHWM") for pid in runners)
    statuses = [status for status, _ in answers]
    return {
        "growth_mb": (peak - ready) / 2**20,
        "wall_s": wall,
        "runners": len(runners),
        "served": statuses.count(200),
        "errors": len(statuses) - statuses.count(200),
        "prompt_tokens": max((tokens for _, tokens in answers), default=0),
    }


async def _requests(base_url: str, model: str, settings: dict[str, Any]) -> list[tuple[int, int]]:
    words, max_tokens = int(settings["prompt_words"]), int(settings["max_tokens"])
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0)) as client:

        async def one(index: int) -> tuple[int, int]:
            content = f"[{index}] {long_prompt(words)}"  # its own first tokens: nothing shared
            body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
            response = await client.post("/v1/chat/completions", json=body)
            usage = response.json().get("usage") or {} if response.status_code == 200 else {}
            return response.status_code, int(usage.get("prompt_tokens") or 0)

        return await asyncio.gather(*(one(k) for k in range(int(settings["requests"]))))


def _status_bytes(pid: int, key: str) -> int:
    """A line of /proc/<pid>/status in bytes (VmRSS: resident now; VmHWM: the peak)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return 0


def _report(settings: dict[str, Any], bursts: dict[str, list[dict[str, Any]]], quick: bool) -> dict[str, Any]:
    measures = {
        f"{side}_{key}": summarize([b[key] for b in bursts[side]], unit)
        for side in SIDES
        for key, unit in (("growth_mb", "MiB"), ("wall_s", "s"))
    }
    growth = [[b["growth_mb"] for b in bursts[side]] for side in SIDES]
    walls = [[b["wall_s"] for b in bursts[side]] for side in SIDES]
    comparisons = {
        "bounded_over_unbounded_growth": compare(growth[1], growth[0], "ratio", "bounded / unbounded peak growth"),
        "bounded_over_unbounded_wall": compare(walls[1], walls[0], "ratio", "bounded / unbounded wall time"),
    }
    targets = {
        "bounded_over_unbounded_growth": target(comparisons["bounded_over_unbounded_growth"]["median"], "<=", 0.9),
        "errors": target(float(sum(b["errors"] for side in SIDES for b in bursts[side])), "<=", 0),
    }
    checks = {"one_runner_per_cluster": all(b["runners"] == 1 for side in SIDES for b in bursts[side])}
    notes = [
        f"prompt of {max(b['prompt_tokens'] for side in SIDES for b in bursts[side])} tokens, "
        f"{settings['max_tokens']} max_tokens, {settings['requests']} at once; kv_cache_bytes "
        f"{int(settings['kv_bytes']) / 2**20:g} MiB on the bounded side (0 = unbounded here)"
    ]
    return bench_result(
        "kv",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        headline=[*comparisons, "unbounded_growth_mb", "bounded_growth_mb"],
        notes=notes,
        checks=checks,
        details={"bursts": bursts},
    )
