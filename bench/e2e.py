"""`shoal bench e2e`: time to first token and decode rate, bare mlx-lm vs through shoal.

In one process tree and one run: bare mlx-lm `stream_generate` (a subprocess with a 1-rank
runner's BLAS environment), then the same prompt through `shoal up --workers 1` with the
official openai client, then `--workers 2`. Medians over `--runs` requests after warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster import Cluster

PROMPT = "Write a long story about a river, a stone and a lantern."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=20, help="measured requests per setup (default 20)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens to generate per request")
    parser.add_argument("--prefill-step", type=int, default=256)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shoal-bench-e2e-") as root:
        env = {**os.environ, "SHOAL_DATA_DIR": str(Path(root) / "data")}
        model_dir = _tiny_dir(env)
        bare = _bare(env, model_dir, args)
        through: dict[str, dict[str, Any]] = {}
        for workers in (1, 2):
            through[f"shoal_{workers}w"] = _through_shoal(Path(root) / f"w{workers}", workers, args)
    one = through["shoal_1w"]
    return {
        "bench": "e2e",
        "model": "tiny",
        "runs": args.runs,
        "max_tokens": args.max_tokens,
        "bare_mlx_lm": bare,
        **through,
        "decode_ratio_1w": round(one["decode_tps"] / bare["decode_tps"], 3),
        "decode_ratio_2w": round(through["shoal_2w"]["decode_tps"] / bare["decode_tps"], 3),
        "ttft_overhead_ms_1w": round(one["ttft_ms"] - bare["ttft_ms"], 1),
        "ttft_overhead_ms_2w": round(through["shoal_2w"]["ttft_ms"] - bare["ttft_ms"], 1),
        "targets": {"decode_ratio_1w": ">= 0.95", "ttft_overhead_ms_1w": "<= 15"},
    }


def _tiny_dir(env: dict[str, str]) -> str:
    code = "from runner.models.tiny import cached_tiny; print(cached_tiny())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _bare(env: dict[str, str], model_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    from runner.blas import blas_env

    child_env = {**env, **blas_env(env.get("SHOAL_BLAS"), 1, os.cpu_count() or 1, env)}
    argv = [
        sys.executable,
        "-m",
        "bench.bare_mlx",
        model_dir,
        PROMPT,
        str(args.max_tokens),
        str(args.runs),
        str(args.prefill_step),
    ]
    out = subprocess.run(argv, env=child_env, capture_output=True, text=True, check=True, timeout=600).stdout
    raw = json.loads(out)
    return _summary(raw["ttft_ms"], raw["decode_tps"], raw["tokens"])


def _through_shoal(root: Path, workers: int, args: argparse.Namespace) -> dict[str, Any]:
    root.mkdir(parents=True)
    cluster = Cluster(root, workers=workers, prefill_step_size=str(args.prefill_step), log_level="WARNING")
    try:
        cluster.wait_ready(timeout=300)
        client = cluster.client(timeout=120)
        ttfts: list[float] = []
        rates: list[float] = []
        counts: list[int] = []
        for attempt in range(args.runs + 2):
            ttft, rate, count = _one_request(client, args.max_tokens)
            if attempt >= 2:
                ttfts.append(ttft)
                rates.append(rate)
                counts.append(count)
        return _summary(ttfts, rates, counts)
    finally:
        cluster.stop()


def _one_request(client: Any, max_tokens: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = last = started
    count = 0
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            if first == started:
                first = now
            last = now
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
    rate = (count - 1) / (last - first) if count > 1 and last > first else 0.0
    return (first - started) * 1000, rate, count


def _summary(ttfts: list[float], rates: list[float], counts: list[int]) -> dict[str, Any]:
    return {
        "ttft_ms": round(statistics.median(ttfts), 2),
        "ttft_ms_p90": round(sorted(ttfts)[int(0.9 * (len(ttfts) - 1))], 2),
        "decode_tps": round(statistics.median(rates), 1),
        "tokens_per_request": statistics.median(counts),
    }
