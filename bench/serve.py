"""`shoal bench serve`: many users at once, side by side: `mlx_lm.server` (the anchor, batching
on), `shoal up --workers 1` and `--workers 2`, and `--workers 1` with `kv_bits: 8` (quantized KV
inside the continuous batch), on each model, at each concurrency.

At a concurrency C, C clients each stream `--requests-per-client` chat requests one after
another (fixed `max_tokens`, greedy). Per side and level: aggregate tokens/s over the level's
wall time, TTFT and inter-token latency p50/p99, errors, hangs (no byte within `--stall-timeout`),
429s with Retry-After (refused beyond `max_queued_tasks`: an answer, counted, not an error), the
connections sent again, and for shoal the events its log stored per generated token. Every side's
client sends a request again while its connection is refused or reset before any answer
(mlx_lm.server's listen backlog is 5), so a burst costs the anchor retries, not requests; what is
still unanswered after them is an error, on every side and at every level.

The anchor runs twice, as a user starts it and with its threads pinned as shoal's runners pin
theirs (`bench.anchor_server`; in one process its HTTP handlers then share the compute CPU), and
shoal is read, per round, against the faster of the two. On every model shoal's engine alone (one
process, a 1-rank runner's continuous batch, no services) decodes the same levels: the ceiling of
the served side, and so of its ratio over the anchor (`<model>_engine_alone_over_mlx_lm_c<C>`,
named in a missed target's account); where compute dominates (`COMPUTE_BOUND`) the served side is
judged against it.

The sides of one level run one after another, their order rotating (`bench.rounds.rotated`),
each after one warm-up request; with `--rounds` R every level is run R times per side, and each
ratio is taken per round (its median and range are reported). The compute-bound model runs
at a fraction of a token per second per parameter-heavy stream on a small machine, so its levels
are the targets' (16 and 64 clients), one request each of fewer tokens (`MODEL_SIZES`), unless the
flags name others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from statistics import median
from typing import Any

from bench.options import Sized, add_sized, resolve
from bench.result import bench_result, readable
from bench.rounds import rotated
from bench.serve_load import run_level, summarize_level
from bench.serve_sides import (
    COMPUTE_BOUND,
    MODELS,
    AnchorServer,
    EngineAloneSide,
    ShoalSide,
    Side,
    events_between,
    model_dir,
)
from bench.stats import compare, rounded, summarize, target

ANCHORS = ("mlx_lm_server", "mlx_lm_server_pinned")
ENGINE_ALONE = "shoal_engine_alone"
KV8 = "shoal_1w_kv8"  # `shoal up --workers 1` with kv_bits 8: quantized KV inside the continuous batch
SIDES = (*ANCHORS, "shoal_1w", "shoal_2w", KV8, ENGINE_ALONE)
BEST_ANCHOR = "mlx_lm_best"  # per round, the faster of the anchors that ran

ABOUT = (
    "streamed chat requests from C concurrent clients (C = 1, 4, 16, 64): mlx_lm.server (batching on; as started "
    "and pinned as shoal's runners, shoal read against the faster per round) vs `shoal up --workers 1` and "
    "`--workers 2` (and --workers 1 with kv_bits 8), on the tiny model, a ~100M-parameter random qwen3 and a ~0.44B one (Qwen3-0.6B's layers), "
    "each beside shoal's engine alone (one process, no services), the ceiling; errors and hangs at every level"
)
SIZED = (
    Sized("--concurrency", "1,4,16,64", "1,4", "comma-separated numbers of concurrent clients", str),
    Sized("--max-tokens", 64, 16, "tokens each request generates"),
    Sized("--models", ",".join(MODELS), "tiny", f"comma-separated models, of: {', '.join(MODELS)}", str),
    Sized("--requests-per-client", 2, 1, "requests each client sends, one after another"),
    Sized("--sides", ",".join(SIDES), ",".join(SIDES), "comma-separated sides to run", str),
    Sized("--rounds", 3, 1, "times each level runs on each side (ratios are per round)"),
)
# What the compute-bound model runs instead of the sizes above, unless their flags are given:
# ~2 tokens/s for one stream on a 2-core machine, so only the targets' levels and short requests.
# Its warm-up (the prefill calibration, the pace's prompt of three chunks) takes minutes on 2 cores.
MODEL_SIZES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {"concurrency": "16,64", "requests_per_client": 1, "max_tokens": 32, "ready_timeout": 1800.0},
}
READY_TIMEOUT_S = 300.0
TARGET_LEVELS = (16, 64)
# issue 45: on tiny (serving overhead dominates) >= 2.0x mlx_lm.server at 16 and 64 clients; elsewhere >= it.
OVER_ANCHOR_MIN = {"tiny": 2.0}
OVER_ANCHOR_MIN_DEFAULT = 1.0
OVER_ENGINE_ALONE_MIN = 0.9  # served >= 0.9x the engine alone decoding the same level in one process
TWO_OVER_ONE_MIN = 0.9
OVER_ONE_STREAM_MIN = 6.0
KV8_OVER_ONE_STREAM_MIN = 3.0  # issue 42: with kv_bits 8, 16 clients >= 3x the tokens/s of one


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--max-queued-tasks", type=int, default=64, help="shoal's queue bound per model")
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=None,
        help=f"seconds each side may take to start (default {READY_TIMEOUT_S:g}; the compute-bound model's own)",
    )
    parser.add_argument(
        "--stall-timeout", type=float, default=300.0, help="seconds without a byte after which a request is a hang"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED) | {
        "max_queued_tasks": args.max_queued_tasks,
        "stall_timeout": args.stall_timeout,
        "ready_timeout": args.ready_timeout or READY_TIMEOUT_S,
    }
    models = [m.strip() for m in str(settings["models"]).split(",") if m.strip()]
    chosen = [s.strip() for s in str(settings["sides"]).split(",") if s.strip()]
    if unknown := set(chosen) - set(SIDES):
        raise SystemExit(f"shoal bench serve: unknown side(s) {sorted(unknown)}; known: {', '.join(SIDES)}")
    per_model = {model: model_settings(settings, model, given=_given(args)) for model in models}
    figures: dict[str, dict[str, dict[int, list[dict[str, Any]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-serve-") as root:
        for model in models:
            figures[model] = _one_model(Path(root), model, chosen, per_model[model])
    return report(settings | {"per_model": per_model}, figures, quick=bool(args.quick))


def _given(args: argparse.Namespace) -> set[str]:
    sized = {option.dest for option in SIZED if getattr(args, option.dest, None) is not None}
    return sized | ({"ready_timeout"} if args.ready_timeout is not None else set())


def model_settings(settings: Mapping[str, Any], model: str, given: set[str]) -> dict[str, Any]:
    """What `model` runs: the bench's sizes, but a `MODEL_SIZES` entry's where no flag named them."""
    own = {key: value for key, value in MODEL_SIZES.get(model, {}).items() if key not in given}
    chosen = {**settings, **own}
    return {
        "levels": [int(c) for c in str(chosen["concurrency"]).split(",") if c.strip()],
        "max_tokens": int(chosen["max_tokens"]),
        "requests_per_client": int(chosen["requests_per_client"]),
        "rounds": int(chosen["rounds"]),
        "max_queued_tasks": int(chosen["max_queued_tasks"]),
        "stall_timeout": float(chosen["stall_timeout"]),
        "ready_timeout": float(chosen["ready_timeout"]),
    }


def _one_model(
    root: Path, model: str, chosen: list[str], sizes: dict[str, Any]
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Per side, per level, one summary per round."""
    directory = model_dir(model, root / "data")
    home = root / model
    home.mkdir()
    max_tokens, levels, ready_timeout = sizes["max_tokens"], sizes["levels"], sizes["ready_timeout"]
    with contextlib.ExitStack() as stack:
        anchors = [
            AnchorServer(directory, home, max_tokens, pinned=name.endswith("_pinned"))
            for name in chosen_anchors(chosen)
        ]
        workers = [w for w in (1, 2) if f"shoal_{w}w" in chosen]
        shoals = [ShoalSide(directory, home, w, sizes["max_queued_tasks"]) for w in workers]
        if KV8 in chosen:
            shoals.append(ShoalSide(directory, home, 1, sizes["max_queued_tasks"], name=KV8, kv_bits="8"))
        engines = [EngineAloneSide(directory, home, max_tokens)] if ENGINE_ALONE in chosen else []
        for side in (*anchors, *shoals, *engines):
            stack.callback(side.stop)
        for anchor in anchors:
            anchor.wait_ready(ready_timeout)
        for shoal in shoals:
            shoal.cluster.wait_ready(ready_timeout)
        for engine in engines:
            engine.wait_ready()
        sides: dict[str, Side | EngineAloneSide] = {side.name: side for side in (*anchors, *shoals, *engines)}
        figures: dict[str, dict[int, list[dict[str, Any]]]] = {name: {c: [] for c in levels} for name in sides}
        for side in (*anchors, *shoals):  # warm-up: compile, allocate (the engine alone warmed up as it started)
            asyncio.run(run_level(side.base_url, str(directory), 1, 1, max_tokens, sizes["stall_timeout"]))
        turn = 0
        for _ in range(sizes["rounds"]):
            for concurrency in levels:
                for name in rotated(list(sides), turn):
                    figures[name][concurrency].append(_measure(sides[name], str(directory), concurrency, sizes))
                turn += 1
    return figures


def chosen_anchors(chosen: list[str]) -> list[str]:
    return [name for name in ANCHORS if name in chosen]


def _measure(side: Side | EngineAloneSide, model: str, concurrency: int, sizes: dict[str, Any]) -> dict[str, Any]:
    if isinstance(side, EngineAloneSide):
        done = side.level(concurrency, sizes["requests_per_client"])
        figures = {key: rounded(done[key], 4) for key in ("aggregate_tps", "wall_s")}
        return {
            **done,
            **figures,
            "served": done["requests"] - done["errors"],
            "hangs": 0,
            "refused_429": 0,
            "retries": 0,
        }
    before = asyncio.run(side.events_stored())
    started = time.perf_counter()
    served = asyncio.run(
        run_level(
            side.base_url,
            model,
            concurrency,
            sizes["requests_per_client"],
            sizes["max_tokens"],
            sizes["stall_timeout"],
        )
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
        with_best = {**sides, **_best_anchor(sides)}
        for ratios in (_ratios, _kv8_ratio):
            model_comparisons, model_targets = ratios(model, with_best)
            comparisons |= model_comparisons
            targets |= model_targets
        targets |= _failures(model, sides)
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
        notes=failure_notes(figures),
        details={"levels": tables},
    )


def failure_notes(figures: dict[str, dict[str, dict[int, list[dict[str, Any]]]]]) -> list[str]:
    """Every side that failed requests, the anchor's too (only shoal's are judged): a dead anchor
    leaves its rounds to the other anchor, which the reader should know."""
    notes = []
    for model, sides in figures.items():
        for side, levels in sides.items():
            rounds = [level for by_round in levels.values() for level in by_round]
            failed = sum(level["errors"] + level.get("hangs", 0) for level in rounds)
            if failed:
                first = next((e for level in rounds for e in level.get("first_errors", [])), "no message")
                asked = sum(level["requests"] for level in rounds)
                notes.append(f"{model}: {side} failed {failed} of {asked} requests (first: {first})")
    return notes


def _best_anchor(sides: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Per level and round, the anchor run that delivered more tokens/s: what shoal is read against."""
    ran = [sides[name] for name in ANCHORS if name in sides]
    if not ran:
        return {}
    levels = set.intersection(*(set(levels) for levels in ran))
    best = {
        c: [max(runs, key=lambda r: r["aggregate_tps"]) for runs in zip(*(levels[c] for levels in ran), strict=True)]
        for c in sorted(levels)
    }
    return {BEST_ANCHOR: best}


def _ratios(model: str, sides: dict[str, dict[int, list[dict[str, Any]]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The issue's ratios at 16 and 64 concurrent clients (or the highest level run, if both are
    beyond it), of the sides that ran, and their targets."""
    one, two, anchor, engine = (sides.get(name, {}) for name in ("shoal_1w", "shoal_2w", BEST_ANCHOR, ENGINE_ALONE))
    if not one:
        return {}, {}
    judged = [c for c in TARGET_LEVELS if c in one] or [max(one)]

    def tps(side: dict[int, list[dict[str, Any]]], c: int) -> list[float]:
        return [r["aggregate_tps"] for r in side[c]]  # one per round: round i of two sides are paired

    out: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    over_anchor = OVER_ANCHOR_MIN.get(model, OVER_ANCHOR_MIN_DEFAULT)
    for level in judged:
        ceiling = None  # the engine alone over the anchor: what serving at no cost would reach
        if engine and level in engine and anchor and level in anchor:
            ceiling = out[f"{model}_engine_alone_over_mlx_lm_c{level}"] = compare(
                tps(engine, level),
                tps(anchor, level),
                "ratio",
                f"shoal's engine alone / the faster mlx_lm.server at {level}: what serving at no cost would reach",
            )
        if anchor and level in anchor:
            name = f"{model}_1w_over_mlx_lm_c{level}"
            out[name] = compare(
                tps(one, level), tps(anchor, level), "ratio", f"shoal_1w / the faster mlx_lm.server at {level}"
            )
            account = _anchor_account(sides, level, None if ceiling is None else ceiling["median"])
            targets[name] = target(out[name]["median"], ">=", over_anchor, bounded_by=account)
            if two and level in two:
                name = f"{model}_2w_over_mlx_lm_c{level}"
                out[name] = compare(
                    tps(two, level), tps(anchor, level), "ratio", f"shoal_2w / the faster mlx_lm.server at {level}"
                )
        if all(a in sides and level in sides[a] for a in ANCHORS):
            out[f"{model}_mlx_lm_pinned_over_unpinned_c{level}"] = compare(
                tps(sides[ANCHORS[1]], level),
                tps(sides[ANCHORS[0]], level),
                "ratio",
                f"mlx_lm.server pinned / as started at {level}",
            )
        if engine and level in engine:
            name = f"{model}_1w_over_engine_alone_c{level}"
            out[name] = compare(
                tps(one, level), tps(engine, level), "ratio", f"shoal_1w / shoal's engine alone at {level}"
            )
            if model in COMPUTE_BOUND:
                targets[name] = target(
                    out[name]["median"], ">=", OVER_ENGINE_ALONE_MIN, bounded_by=_engine_account(sides, level)
                )
    level = judged[0]
    if two and level in two:
        name = f"{model}_2w_over_1w_c{level}"
        out[name] = compare(tps(two, level), tps(one, level), "ratio", f"2w / 1w at {level}")
        targets[name] = target(
            out[name]["median"],
            ">=",
            TWO_OVER_ONE_MIN,
            bounded_by="on one machine the 2 workers' ranks share its cores: the split adds a hop per token and no compute",
        )
    if 1 in one and level != 1:
        name = f"{model}_1w_c{level}_over_1_stream"
        out[name] = compare(tps(one, level), tps(one, 1), "ratio", f"shoal_1w at {level} / at 1")
        targets[name] = target(out[name]["median"], ">=", OVER_ONE_STREAM_MIN, bounded_by=_batch_account(one, level))
    return out, targets


def _kv8_ratio(model: str, sides: dict[str, dict[int, list[dict[str, Any]]]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """With kv_bits 8, the tokens/s at 16 clients (or the highest level run) over one client's."""
    kv8 = sides.get(KV8, {})
    level = next((c for c in TARGET_LEVELS if c in kv8), max(kv8, default=1))
    if 1 not in kv8 or level == 1:
        return {}, {}
    name = f"{model}_1w_kv8_c{level}_over_1_stream"
    ratio = compare(
        [r["aggregate_tps"] for r in kv8[level]],
        [r["aggregate_tps"] for r in kv8[1]],
        "ratio",
        f"shoal_1w with kv_bits 8 at {level} / at 1",
    )
    judged = target(ratio["median"], ">=", KV8_OVER_ONE_STREAM_MIN, bounded_by=_batch_account(kv8, level))
    return {name: ratio}, {name: judged}


def _anchor_account(sides: dict[str, dict[int, list[dict[str, Any]]]], level: int, ceiling: float | None) -> str:
    """What bounds shoal against the anchor at `level`, from this run: the events it stored per token,
    and, where the engine alone ran, its rate and `ceiling` (its ratio over the anchor)."""
    events = [r["events_per_token"] for r in sides["shoal_1w"][level] if r.get("events_per_token") is not None]
    text = f"shoal_1w stored {_median_text(events)} events per generated token at {level} clients"
    if ceiling is not None:
        engine, served = ([r["aggregate_tps"] for r in sides[side][level]] for side in (ENGINE_ALONE, "shoal_1w"))
        text += (
            f"; its engine alone (the same batch in one process, no services) decoded {_median_text(engine)} tok/s "
            f"there against shoal_1w's {_median_text(served)}: {readable(ceiling)}x the anchor, what serving at no "
            "cost would reach"
        )
    return text


def _batch_account(one: dict[int, list[dict[str, Any]]], level: int) -> str:
    """How shoal_1w's batch of `level` streams compared with its single stream, from this run."""
    alone, batch = ([r["aggregate_tps"] for r in one[c]] for c in (1, level))
    itl = [r["itl_ms_p50"] for r in one[level] if r.get("itl_ms_p50") is not None]
    itl_one = [r["itl_ms_p50"] for r in one[1] if r.get("itl_ms_p50") is not None]
    return (
        f"shoal_1w served one stream at {_median_text(alone)} tok/s and {level} at {_median_text(batch)}: a step of "
        f"{level} rows took {_median_text(itl)} ms (inter-token p50) against {_median_text(itl_one)} ms for one row"
    )


def _engine_account(sides: dict[str, dict[int, list[dict[str, Any]]]], level: int) -> str:
    one = sides["shoal_1w"][level]
    events = [r["events_per_token"] for r in one if r.get("events_per_token") is not None]
    ttft = [r["ttft_ms_p50"] for r in one if r.get("ttft_ms_p50") is not None]
    return (
        f"serving's share of the same cores: shoal_1w stored {_median_text(events)} events per token and its "
        f"TTFT p50 was {_median_text(ttft)} ms at {level} clients (the API, NATS and the runner's bridge run "
        "beside the forward on this machine)"
    )


def _median_text(values: list[float]) -> str:
    return readable(median(values)) if values else "no"


def _failures(model: str, sides: dict[str, dict[int, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Errors and hangs of shoal's sides at every level and round (429 with Retry-After is an answer)."""
    shoal = {side: levels for side, levels in sides.items() if side.startswith("shoal_") and side != ENGINE_ALONE}
    where = [
        f"{side} at {c}: {sum(r['errors'] for r in rounds)} errors, {sum(r.get('hangs', 0) for r in rounds)} hangs"
        for side, levels in shoal.items()
        for c, rounds in levels.items()
        if any(r["errors"] or r.get("hangs", 0) for r in rounds)
    ]
    errors = sum(r["errors"] for levels in shoal.values() for rounds in levels.values() for r in rounds)
    hangs = sum(r.get("hangs", 0) for levels in shoal.values() for rounds in levels.values() for r in rounds)
    if not shoal:
        return {}
    return {
        f"{model}_shoal_errors_every_level": target(errors, "<=", 0, bounded_by="; ".join(where)),
        f"{model}_shoal_hangs_every_level": target(hangs, "<=", 0, bounded_by="; ".join(where)),
    }


def _all_answered(figures: dict[str, dict[str, dict[int, list[dict[str, Any]]]]]) -> bool:
    return all(
        level["served"] + level["refused_429"] + level["errors"] + level.get("hangs", 0) == level["requests"]
        for sides in figures.values()
        for levels in sides.values()
        for rounds in levels.values()
        for level in rounds
    )
