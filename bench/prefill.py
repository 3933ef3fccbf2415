"""`shoal bench prefill`: overlapped pipeline prefill vs the sequential path vs one rank.

One process tree, one run: an N-rank group runs the pipeline and sequential paths alternately
on the same prompt (after a warm-up), then a 1-rank group using all of the node's cores runs
the same prompt with the same chunk size. Prefill rate = prompt tokens / time to first token.
`ideal = N*M/(M+N-1)` is the GPipe bound for M chunks; `efficiency = speedup / ideal`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

BENCH_MODEL = {"layers": 8, "hidden": 512, "vocab": 1024, "seed": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048, help="prompt length")
    parser.add_argument("--step", type=int, default=256, help="chunk size of both paths (tokens)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each path; the best is reported")
    parser.add_argument("--model", default=None, help="model dir (default: an 8-layer d=512 tiny model)")
    parser.add_argument("--deadline", type=float, default=300.0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from runner.engine.plan import MAX_STEP_DIVISOR, chunk_sizes, even_split
    from runner.local.launch import run_group
    from runner.local.local_run import synthetic_prompt
    from runner.models.model_info import read_model_info
    from runner.models.tiny import TinySpec, cached_tiny

    model_dir = Path(args.model) if args.model else cached_tiny(TinySpec(**BENCH_MODEL))
    load_before = round(os.getloadavg()[0], 2)
    n_layers = read_model_info(model_dir).n_layers
    world, chunk = args.ranks, args.step
    # The engine divides prefill_step_size by min(4, world); undo it so both sides use `chunk`.
    group_step = chunk * min(MAX_STEP_DIVISOR, world)
    prompt = synthetic_prompt(args.tokens)
    paths = ["pipeline", "sequential"] * args.repeats
    group = _job(model_dir, even_split(n_layers, world), group_step, prompt, paths)
    single = _job(model_dir, [(0, n_layers)], chunk, prompt, ["sequential"] * args.repeats)
    group_results = run_group(group, world, args.deadline)
    single_results = run_group(single, 1, args.deadline, {"OPENBLAS_NUM_THREADS": str(os.cpu_count() or 1)})
    rates = _best_rates(group_results, paths)
    single_rate = _best_rates(single_results, ["sequential"] * args.repeats)["sequential"]
    m = len(chunk_sizes(args.tokens, chunk))
    speedup = rates["pipeline"] / rates["sequential"]
    ideal = world * m / (m + world - 1)
    return {
        "ranks": world,
        "tokens": args.tokens,
        "step": chunk,
        "chunks": m,
        "model": str(model_dir),
        "blas": os.environ.get("SHOAL_BLAS", "auto"),
        "cpu_count": os.cpu_count(),
        # Ranks share the node's cores: anything else running skews every ratio, so say so.
        "load_avg_1m_before": load_before,
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "overlapped_tps": round(rates["pipeline"], 1),
        "sequential_tps": round(rates["sequential"], 1),
        "single_rank_tps": round(single_rate, 1),
        "speedup": round(speedup, 3),
        "ideal": round(ideal, 3),
        "efficiency": round(speedup / ideal, 3),
        "overlapped_vs_single_rank": round(rates["pipeline"] / single_rate, 3),
        "samples_tps": {path: [round(r, 1) for r in _rates(group_results, paths, path)] for path in set(paths)},
    }


def _job(model_dir: Any, ranges: list[tuple[int, int]], step: int, prompt: list[int], paths: list[str]) -> dict:
    tasks = [
        {"request": {"task_id": f"{path}-{i}", "prompt_token_ids": prompt, "max_tokens": 1, "prefill_path": path}}
        for i, path in enumerate(paths)
    ]
    settings = {"prefill_step_size": step}
    return {"model_dir": str(model_dir), "layer_ranges": ranges, "settings": settings, "tasks": tasks}


def _rates(results: list[dict], paths: list[str], path: str) -> list[float]:
    """Per run: prompt tokens / the slowest rank's time to first token."""
    rates = []
    for index, task_path in enumerate(paths):
        if task_path == path:
            outcomes = [r["results"][index] for r in results]
            ttft_s = max(o["ttft_ms"] for o in outcomes) / 1000
            rates.append(outcomes[0]["prompt_tokens"] / ttft_s)
    return rates


def _best_rates(results: list[dict], paths: list[str]) -> dict[str, float]:
    return {path: max(_rates(results, paths, path)) for path in set(paths)}
