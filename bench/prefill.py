"""`shoal bench prefill`: overlapped pipeline prefill vs the sequential path, and the baselines that explain it.

Each round (sides in rotating order) runs, on the same prompt and chunk size:
- an N-rank ring group (each rank's BLAS threads as a runner sets them: `runner.blas.BlasThreads`)
  running the pipeline and the sequential path back to back, each rank keeping its timeline
  (`runner.local.timeline`), from which `bench.prefill_timeline` reads where its time went in the
  pipeline's iterations: busy (CPU) or waiting, the agreement, the bubble;
- one process on all the node's cores (`OPENBLAS_NUM_THREADS` = cores);
- one process on one thread (`OPENBLAS_NUM_THREADS=1`).
Prefill rate = prompt tokens / the slowest rank's time to first token. Then a ring probe
(`bench.ring_probe`) times the protocol's per-chunk costs: one all-reduce and one send/recv
of a chunk's activations. `ideal = N*M/(M+N-1)` is the GPipe bound for M chunks over one stage at
a time, and `efficiency = median(per-round pipeline / one process on one thread) / ideal`: a rank
runs at its share of the cores, one thread on a 2-core node with 2 ranks, so one process on one
thread is one stage at a time at that speed. (The batch's sequential path is not that baseline:
its chunks are pipelined through the ranks too, `runner/engine/batch_chunks.py`.) The ideal
assumes an iteration with every rank computing takes one stage's compute alone:
`stage_alone_over_iteration` measures that (a chunk on one thread / N, over the iteration). The
ceiling a node can give is measured, not assumed: one process on all cores over one process on one
thread.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path
from typing import Any

from bench.options import Sized, add_sized, resolve
from bench.prefill_timeline import pipeline_account
from bench.result import bench_result, median_text, readable
from bench.ring_probe import probe
from bench.rounds import rotated, run_rounds
from bench.stats import compare, summarize, target

BENCH_MODEL = {"layers": 8, "hidden": 512, "vocab": 1024, "seed": 0}
# issue 45: overlapped prefill >= 0.95 of the GPipe ideal on 2 ranks, >= 0.9 on 3.
EFFICIENCY_MIN = {2: 0.95, 3: 0.9}
EFFICIENCY_MIN_DEFAULT = 0.9
ABOUT = (
    "prefill rate of the overlapped pipeline vs the sequential path on N ranks, vs one process on all cores and "
    "on one thread (interleaved rounds; tiny model d=512, 8 layers); ring all-reduce and send/recv costs"
)
SIZED = (
    Sized("--rounds", 5, 1, "rounds; each runs every side once"),
    Sized("--tokens", 2048, 384, "prompt length"),
    Sized("--probe-reps", 200, 20, "repetitions of each ring probe operation"),
)
PATHS = ("pipeline", "sequential")
SIDES = ("group", "one_process_all_cores", "one_process_one_thread")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--step", type=int, default=256, help="chunk size of both paths (tokens)")
    parser.add_argument("--model", default=None, help="model dir (default: an 8-layer d=512 tiny model)")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds one group run may take")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from runner.engine.plan import MAX_STEP_DIVISOR, chunk_sizes, even_split
    from runner.local.launch import run_group
    from runner.local.local_run import synthetic_prompt
    from runner.models.model_info import read_model_info
    from runner.models.tiny import TinySpec, cached_tiny

    settings = resolve(args, SIZED) | {"ranks": args.ranks, "step": args.step}
    model_dir = Path(args.model) if args.model else cached_tiny(TinySpec(**BENCH_MODEL))
    n_layers = read_model_info(model_dir).n_layers
    world, chunk, cores = args.ranks, args.step, os.cpu_count() or 1
    # The engine divides prefill_step_size by min(4, world); undo it so every side uses `chunk`.
    group_step = chunk * min(MAX_STEP_DIVISOR, world)
    prompt = synthetic_prompt(settings["tokens"])
    group_runs = itertools.count()

    def group() -> dict[str, Any]:
        paths = rotated(PATHS, next(group_runs))  # the two paths take turns going first, too
        job = _job(model_dir, even_split(n_layers, world), group_step, prompt, paths) | {"timeline": True}
        results = run_group(job, world, args.deadline)
        return {path: _rate(results, index) for index, path in enumerate(paths)} | {
            "timeline": _timeline(results, paths.index("pipeline"), world)
        }

    def one_process(threads: int) -> float:
        job = _job(model_dir, [(0, n_layers)], chunk, prompt, ["sequential"])
        return _rate(run_group(job, 1, args.deadline, {"OPENBLAS_NUM_THREADS": str(threads)}), 0)

    sides = {
        "group": group,
        "one_process_all_cores": lambda: one_process(cores),
        "one_process_one_thread": lambda: one_process(1),
    }
    samples = run_rounds(sides, settings["rounds"])
    hidden, dtype = _activation_shape(model_dir)
    costs = probe(world, chunk, hidden, dtype, settings["probe_reps"])
    m = len(chunk_sizes(settings["tokens"], chunk))
    return _report(settings, samples, costs, chunks=m, cores=cores, model=str(model_dir), quick=bool(args.quick))


def _job(model_dir: Path, ranges: list[tuple[int, int]], step: int, prompt: list[int], paths: list[str]) -> dict:
    tasks = [
        {"request": {"task_id": f"{path}-{i}", "prompt_token_ids": prompt, "max_tokens": 1, "prefill_path": path}}
        for i, path in enumerate(paths)
    ]
    return {
        "model_dir": str(model_dir),
        "layer_ranges": ranges,
        "settings": {"prefill_step_size": step},
        "tasks": tasks,
    }


def _rate(results: list[dict], index: int) -> float:
    """Task `index`: prompt tokens / the slowest rank's time to first token."""
    outcomes = [r["results"][index] for r in results]
    return outcomes[0]["prompt_tokens"] / (max(o["ttft_ms"] for o in outcomes) / 1000)


def _timeline(results: list[dict], index: int, world: int) -> dict[str, float]:
    """Where the ranks' time went in the pipeline task's iterations (`bench.prefill_timeline`)."""
    ran = results[0]["results"][index]["prefill_iterations"]  # chunks + world - 1 on every rank
    return pipeline_account([r["timeline"] for r in results], f"pipeline-{index}", chunks=ran - world + 1)


def _activation_shape(model_dir: Path) -> tuple[int, str]:
    config = json.loads((model_dir / "config.json").read_text())
    return int(config["hidden_size"]), str(config.get("torch_dtype", "float32"))


def _report(
    settings: dict[str, Any],
    samples: dict[str, list[Any]],
    costs: dict[str, list[float]],
    *,
    chunks: int,
    cores: int,
    model: str,
    quick: bool,
) -> dict[str, Any]:
    world = settings["ranks"]
    rates = {
        "overlapped_tps": [g["pipeline"] for g in samples["group"]],
        "sequential_tps": [g["sequential"] for g in samples["group"]],
        "one_process_all_cores_tps": samples["one_process_all_cores"],
        "one_process_one_thread_tps": samples["one_process_one_thread"],
    }
    measures: dict[str, Any] = {name: summarize(values, "tok/s") for name, values in rates.items()}
    measures["all_reduce_ms"] = summarize(costs["all_reduce"], "ms")
    measures["send_recv_ms"] = summarize(costs["send_recv"], "ms")
    measures["chunk_one_thread_ms"] = summarize(
        [settings["step"] / r * 1000 for r in rates["one_process_one_thread_tps"]], "ms"
    )
    timelines: list[dict[str, float]] = [g["timeline"] for g in samples["group"]]
    for name in timelines[0]:
        measures[f"overlapped_{name}"] = summarize([t[name] for t in timelines if name in t], "ms")
    stage_alone = [settings["step"] / r * 1000 / world for r in rates["one_process_one_thread_tps"]]
    measures["stage_alone_ms"] = summarize(stage_alone, "ms")
    comparisons = {
        "stage_alone_over_iteration": compare(
            stage_alone,
            [t["iteration_ms"] for t in timelines],
            "ratio",
            f"a stage's compute alone (a chunk on one thread / {world}) / an overlapped iteration, every rank computing",
        ),
        "speedup_over_one_thread": compare(
            rates["overlapped_tps"],
            rates["one_process_one_thread_tps"],
            "ratio",
            "overlapped / one process on one thread (a stage at a time, at one rank's share of the cores)",
        ),
        "overlapped_over_sequential": compare(
            rates["overlapped_tps"],
            rates["sequential_tps"],
            "ratio",
            "overlapped / sequential (the batch's path, its chunks pipelined through the ranks too)",
        ),
        "overlapped_vs_one_process_all_cores": compare(
            rates["overlapped_tps"], rates["one_process_all_cores_tps"], "ratio", "overlapped / one process, all cores"
        ),
        "ceiling": compare(
            rates["one_process_all_cores_tps"],
            rates["one_process_one_thread_tps"],
            "ratio",
            f"one process on {cores} cores / one process on one thread",
        ),
        "sequential_vs_one_thread": compare(
            rates["sequential_tps"],
            rates["one_process_one_thread_tps"],
            "ratio",
            "sequential / one process, one thread",
        ),
    }
    ideal = world * chunks / (chunks + world - 1)
    speedup = comparisons["speedup_over_one_thread"]["median"]
    efficiency = None if speedup is None else round(speedup / ideal, 3)
    return bench_result(
        "prefill",
        about=ABOUT,
        variant=f"{world}ranks",
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets={
            "efficiency": target(
                efficiency,
                ">=",
                EFFICIENCY_MIN.get(world, EFFICIENCY_MIN_DEFAULT),
                bounded_by=_efficiency_account(measures, comparisons, world, cores),
            )
        },
        headline=[
            "overlapped_tps",
            "sequential_tps",
            "one_process_all_cores_tps",
            "one_process_one_thread_tps",
            "speedup_over_one_thread",
            "overlapped_over_sequential",
            "ceiling",
            "overlapped_vs_one_process_all_cores",
        ],
        notes=_notes(measures, comparisons, ideal, efficiency, world, cores, settings["step"]),
        details={"chunks": chunks, "ideal": round(ideal, 3), "efficiency": efficiency, "model": model},
    )


def _efficiency_account(measures: dict[str, Any], comparisons: dict[str, Any], world: int, cores: int) -> str:
    """What bounds the overlapped pipeline against the GPipe ideal, from this run's medians: the
    ideal assumes `world` ranks at once run `world`x one; on `cores` cores they share, they cannot."""

    def median(name: str) -> str:
        return median_text(measures, comparisons, name)

    return (
        f"the ideal assumes an iteration with all {world} ranks computing takes one stage's compute alone; it took "
        f"{median('overlapped_iteration_ms')} ms (the slowest rank's; busy / waiting per rank: "
        f"{_per_rank(measures, comparisons, world)}, of which the agreement and "
        f"hand-off {median('overlapped_agreement_ms')} ms) against a stage's {median('stage_alone_ms')} ms alone on "
        f"one thread: {median('stage_alone_over_iteration')}, the efficiency this leaves. The ranks share {cores} "
        f"cores, on which one process runs {median('ceiling')}x one thread: a rank's busy time is its stage's "
        f"compute on its share of them; its waiting is for the upstream rank's activations (send/recv "
        f"{median('send_recv_ms')} ms alone) and the agreement (all-reduce {median('all_reduce_ms')} ms alone); an "
        f"idle iteration of the bubble took {median('overlapped_bubble_iteration_ms')} ms"
        + (
            f"; with {world} ranks on {cores} cores at most {cores} compute at once, so an iteration with all of "
            f"them computing takes at least {world}/{cores} of a stage: a ceiling of {cores / world:.2f}"
            if world > cores
            else ""
        )
    )


def _notes(
    measures: dict[str, Any],
    comparisons: dict[str, Any],
    ideal: float,
    efficiency: float | None,
    world: int,
    cores: int,
    step: int,
) -> list[str]:
    def median(name: str) -> str:
        return median_text(measures, comparisons, name)

    return [
        f"overlapped / one process on one thread = {median('speedup_over_one_thread')} on {world} ranks, against "
        f"a GPipe ideal of {readable(ideal)} (efficiency {efficiency}); the ideal assumes {world} ranks computing at "
        f"once run {world}x as fast as one stage at a time.",
        f"the batch's sequential path pipelines its chunks through the ranks too (`batch_chunks`): it ran "
        f"{median('sequential_vs_one_thread')}x one thread; the overlapped path ran "
        f"{median('overlapped_over_sequential')}x its rate.",
        f"the node's ceiling: one process on {cores} cores runs {median('ceiling')}x one process on one thread "
        f"({median('one_process_all_cores_tps')} vs {median('one_process_one_thread_tps')} tok/s); the overlapped "
        f"pipeline runs {median('overlapped_vs_one_process_all_cores')}x one process on all cores.",
        f"per chunk of {step} tokens: {median('chunk_one_thread_ms')} ms of compute through every layer on one "
        f"thread, against an all-reduce of {median('all_reduce_ms')} ms and a send/recv of "
        f"{median('send_recv_ms')} ms on the ring (medians).",
        f"an overlapped iteration with every rank computing took {median('overlapped_iteration_ms')} ms against a "
        f"stage's {median('stage_alone_ms')} ms alone: {median('stage_alone_over_iteration')} "
        f"(per rank, busy / waiting: {_per_rank(measures, comparisons, world)}).",
    ]


def _per_rank(measures: dict[str, Any], comparisons: dict[str, Any], world: int) -> str:
    """Each rank's busy / waiting time in its pipeline iterations (medians), in rank order."""

    def median(name: str) -> str:
        return median_text(measures, comparisons, name)

    return ", ".join(
        f"{median(f'overlapped_rank{r}_busy_ms')} / {median(f'overlapped_rank{r}_idle_ms')} ms" for r in range(world)
    )
