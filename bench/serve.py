"""`shoal bench serve`: many users at once, side by side: `mlx_lm.server` (the anchor, batching
on), `shoal up --workers 1` and `--workers 2`, on each model, at each concurrency.

At a concurrency C, C clients each stream `--requests-per-client` chat requests one after
another (fixed `max_tokens`, greedy). Per side and level: aggregate tokens/s over the level's
wall time, TTFT and inter-token latency p50/p99, errors, 429s (refused beyond
`max_queued_tasks`: counted, not errors), and for shoal the events its log stored per generated
token. The sides of one level run one after another, their order rotating
(`bench.rounds.rotated`), each after one warm-up request; with `--rounds` R every level is run R
times per side, and each ratio is taken per round (its median and range are reported), since one
run's ratio on a shared machine moves by 0.1-0.3 from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.rounds import rotated
from bench.serve_load import run_level, summarize_level
from bench.serve_sides import MODELS, AnchorServer, ShoalSide, Side, events_between, model_dir
from bench.stats import compare, summarize, target

SIDES = ("mlx_lm_server", "shoal_1w", "shoal_2w")

ABOUT = (
    "streamed chat requests from C concurrent clients (C = 1, 4, 16, 64): mlx_lm.server (batching on) vs "
    "`shoal up --workers 1` and `--workers 2`, on the tiny model and a ~100M-parameter random qwen3"
)
SIZED = (
    Sized("--concurrency", "1,4,16,64", "1,4", "comma-separated numbers of concurrent clients", str),
    Sized("--max-tokens", 64, 16, "tokens each request generates"),
    Sized("--models", ",".join(MODELS), "tiny", f"comma-separated models, of: {', '.join(MODELS)}", str),
    Sized("--requests-per-client", 2, 1, "requests each client sends, one after another"),
    Sized("--sides", ",".join(SIDES), ",".join(SIDES), "comma-separated sides to run", str),
    Sized("--rounds", 3, 1, "times each level runs on each side (ratios are per round)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--max-queued-tasks", type=int, default=64, help="shoal's queue bound per model")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds each side may take to start")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED) | {"max_queued_tasks": args.max_queued_tasks}
    levels = [int(c) for c in str(settings["concurrency"]).split(",") if c.strip()]
    models = [m.strip() for m in str(settings["models"]).split(",") if m.strip()]
    chosen = [s.strip() for s in str(settings["sides"]).split(",") if s.strip()]
    if unknown := set(chosen) - set(SIDES):
        raise SystemExit(f"shoal bench serve: unknown side(s) {sorted(unknown)}; known: {', '.join(SIDES)}")
    figures: dict[str, dict[str, dict[int, list[dict[str, Any]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-serve-") as root:
        for model in models:
            figures[model] = _one_model(Path(root), model, levels, chosen, settings, args.ready_timeout)
    return report(settings, figures, quick=bool(args.quick))


def _one_model(
    root: Path, model: str, levels: list[int], chosen: list[str], settings: dict[str, Any], ready_timeout: float
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Per side, per level, one summary per round."""
    directory = model_dir(model, root / "data")
    home = root / model
    home.mkdir()
    max_tokens = int(settings["max_tokens"])
    with contextlib.ExitStack() as stack:
        anchors = [AnchorServer(directory, home, max_tokens)] if "mlx_lm_server" in chosen else []
        workers = [w for w in (1, 2) if f"shoal_{w}w" in chosen]
        shoals = [ShoalSide(directory, home, w, int(settings["max_queued_tasks"])) for w in workers]
        for side in (*anchors, *shoals):
            stack.callback(side.stop)
        for anchor in anchors:
            anchor.wait_ready(ready_timeout)
        for shoal in shoals:
            shoal.cluster.wait_ready(ready_timeout)
        sides: dict[str, Side] = {side.name: side for side in (*anchors, *shoals)}
        figures: dict[str, dict[int, list[dict[str, Any]]]] = {name: {c: [] for c in levels} for name in sides}
        for side in sides.values():  # warm-up: compile, allocate
            asyncio.run(run_level(side.base_url, str(directory), 1, 1, max_tokens))
        turn = 0
        for _ in range(int(settings["rounds"])):
            for concurrency in levels:
                for name in rotated(list(sides), turn):
                    figures[name][concurrency].append(_measure(sides[name], str(directory), concurrency, settings))
                turn += 1
    return figures


def _measure(side: Side, model: str, concurrency: int, settings: dict[str, Any]) -> dict[str, Any]:
    before = asyncio.run(side.events_stored())
    started = time.perf_counter()
    served = asyncio.run(
        run_level(side.base_url, model, concurrency, int(settings["requests_per_client"]), int(settings["max_tokens"]))
    )
    wall = time.perf_counter() - started
    return summarize_level(served, wall, events_between(side, before))


def report(
    settings: dict[str, Any], figures: dict[str, dict[str, dict[int, list[dict[str, Any]]]]], quick: bool
) -> dict[str, Any]:
    measures: dict[str, Any] = {}
    comparisons: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for model, sides in figures.items():
        for side, levels in sides.items():
            for concurrency, rounds in levels.items():
                measures[f"{model}_{side}_c{concurrency}_tps"] = summarize(
                    [r["aggregate_tps"] for r in rounds], "tok/s"
                )
        comparisons |= _ratios(model, sides)
        shoal_levels = [levels for side, levels in sides.items() if side.startswith("shoal_")]
        top = max((c for levels in shoal_levels for c in levels), default=None)
        if top is not None:
            errors = sum(r["errors"] for levels in shoal_levels for r in levels[top])
            targets[f"{model}_shoal_errors_c{top}"] = target(errors, "<=", 0)
    for name, comparison in comparisons.items():
        bound = 0.9 if "2w_over_1w" in name else (6.0 if "over_1_stream" in name else 1.0)
        targets[name] = target(comparison["median"], ">=", bound)
    tables = {  # every round's summary, in round order
        model: {side: {str(c): rounds for c, rounds in levels.items()} for side, levels in sides.items()}
        for model, sides in figures.items()
    }
    return bench_result(
        "serve",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        headline=list(comparisons),
        checks={"every_level_answered_every_request": _all_answered(figures)},
        details={"levels": tables},
    )


def _ratios(model: str, sides: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    """The issue's ratios at 16 concurrent clients (or the highest level run, if below), of the
    sides that ran."""
    one, two, anchor = (sides.get(name, {}) for name in ("shoal_1w", "shoal_2w", "mlx_lm_server"))
    if not one:
        return {}
    level = 16 if 16 in one else max(one)

    def tps(side: dict[int, list[dict[str, Any]]], c: int) -> list[float]:
        return [r["aggregate_tps"] for r in side[c]]  # one per round: round i of two sides are paired

    out: dict[str, Any] = {}
    if anchor:
        out[f"{model}_1w_over_mlx_lm_c{level}"] = compare(
            tps(one, level), tps(anchor, level), "ratio", f"shoal_1w / mlx_lm_server at {level}"
        )
    if two:
        out[f"{model}_2w_over_1w_c{level}"] = compare(tps(two, level), tps(one, level), "ratio", f"2w / 1w at {level}")
    if 1 in one and level != 1:
        out[f"{model}_1w_c{level}_over_1_stream"] = compare(
            tps(one, level), tps(one, 1), "ratio", f"shoal_1w at {level} / at 1"
        )
    return out


def _all_answered(figures: dict[str, dict[str, dict[int, list[dict[str, Any]]]]]) -> bool:
    return all(
        level["served"] + level["refused_429"] + level["errors"] == level["requests"]
        for sides in figures.values()
        for levels in sides.values()
        for rounds in levels.values()
        for level in rounds
    )
