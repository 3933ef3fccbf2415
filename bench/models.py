"""`shoal bench models`: two models served side by side, requests alternating between them.

Sides: `mlx_lm.server` (started with `--model` the first model; it loads the model named in each
request's `model` field, one at a time: a request for the other model drains its batch and loads
that one in place) and `shoal up --workers N` with both models configured (`models`), both placed
before anything is measured. Both sides serve the SAME two model directories: the tiny llama and
`qwen3-25m`, a random qwen3 (`bench.serve_sides`), each named by its path.

At a concurrency C, C clients each stream `--requests-per-client` chat requests one after another,
client j's k-th naming model (j + k) mod 2 (`bench.serve_load.run_alternating`). Per side and
level: TTFT p50/p99 over every request of the level and aggregate tokens/s over its wall time. The
sides of a level run one after another, their order rotating per level and round, and each ratio
is taken per round (median and range reported), as `shoal bench serve` does.

Cold load on demand (shoal): after each round's levels, each model in turn is unloaded
(`POST /v1/admin/models/unload`), `/v1/models` is waited on until it says `unloaded`, and one
streamed request for it is timed: its TTFT, request sent to first token. It is compared with the
model's warm-up at `shoal up`: from its first `InstancePlaced` to every rank of that instance ready
(`RunnerStatusChanged`), by the log's wall times (`bench.warmups`); the cold instance's own warm-up
(same definition) is reported beside it, so what load on demand adds beyond a warm-up shows.

Why `--workers 1` (with `min_nodes_per_instance` 1): mlx_lm.server is one process on one machine,
and so is a one-worker shoal: one node holding both models. Both models fit one node, so with
`--workers 2` each instance still runs on one node, in one runner process of its own, on the same
two cores; the second worker only adds a process that competes for them and a node that shares the
first one's memory (workers on one host share it). `--workers 2` measures that configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.models_sides import HEADERS, ShoalModels
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result, readable
from bench.rounds import rotated
from bench.serve_load import Served, run_alternating, summarize_level
from bench.serve_sides import AnchorServer, model_dir
from bench.stats import compare, percentile, rounded, summarize, target
from bench.warmups import Warmup, first_warmup

MODELS = ("tiny", "qwen3-25m")
SIDES = ("mlx_lm_server", "shoal")
TARGET_TTFT_RATIO = 10.0  # mlx_lm.server's p50 TTFT / shoal's, while alternating
TARGET_TPS_RATIO = 1.5  # shoal's aggregate tokens/s / mlx_lm.server's
TARGET_COLD_OVER_WARMUP = 1.2  # a cold request's TTFT / the model's warm-up at `shoal up`

ABOUT = (
    "two models (the tiny llama, a ~25M random qwen3), each client's requests alternating between them, "
    "1 and 8 clients: mlx_lm.server (loads the model each request names) vs `shoal up --workers 1` serving "
    "both; and shoal's cold load on demand (unload, then one request) vs its warm-up at `shoal up`"
)
SIZED = (
    Sized("--concurrency", "1,8", "1,2", "comma-separated numbers of concurrent clients", str),
    Sized("--max-tokens", 32, 8, "tokens each request generates"),
    Sized("--requests-per-client", 4, 2, "requests each client sends, one after another, alternating models"),
    Sized("--rounds", 3, 1, "times each level runs on each side, and cold loads per model (ratios are per round)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--workers", type=int, default=1, help="shoal up's workers (nodes) on this machine")
    parser.add_argument(
        "--min-nodes-per-instance",
        type=int,
        default=1,
        help="shoal's min_nodes_per_instance (1: each model on one node)",
    )
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds each side may take to start")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED) | {"workers": args.workers, "min_nodes_per_instance": args.min_nodes_per_instance}
    levels = [int(c) for c in str(settings["concurrency"]).split(",") if c.strip()]
    max_tokens = int(settings["max_tokens"])
    with tempfile.TemporaryDirectory(prefix="shoal-bench-models-") as root, contextlib.ExitStack() as stack:
        directories = {label: str(model_dir(label, Path(root) / "data")) for label in MODELS}
        labels = {path: label for label, path in directories.items()}
        paths = list(directories.values())
        anchor = AnchorServer(Path(paths[0]), Path(root), max_tokens)
        stack.callback(anchor.stop)
        shoal = ShoalModels(paths, Path(root), args.workers, args.min_nodes_per_instance)
        stack.callback(shoal.stop)
        anchor.wait_ready(args.ready_timeout)
        placed = shoal.wait_all_placed(args.ready_timeout)
        urls = {"mlx_lm_server": anchor.base_url, "shoal": shoal.base_url}
        for url in urls.values():  # warm-up: each model once on each side (compile, allocate)
            asyncio.run(run_alternating(url, paths, 1, len(paths), max_tokens, HEADERS))
        figures: dict[str, dict[int, list[dict[str, Any]]]] = {side: {c: [] for c in levels} for side in SIDES}
        steady: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        cold: dict[str, list[dict[str, Any]]] = {label: [] for label in MODELS}
        turn = 0
        for _ in range(int(settings["rounds"])):
            for concurrency in levels:
                for side in rotated(list(SIDES), turn):
                    figures[side][concurrency].append(_measure(urls[side], paths, labels, concurrency, settings))
                turn += 1
            for side in rotated(list(SIDES), turn):  # the same requests, no switching: what alternating costs
                steady[side].append(_measure_steady(urls[side], paths, labels, settings))
            turn += 1
            for path in paths:
                cold[labels[path]].append(shoal.cold(path, max_tokens, args.ready_timeout))
        found = shoal.warmups()
    startup = {labels[p]: first_warmup(found, p) for p in paths}
    placements = {labels[p]: card["instances"] for p, card in placed.items()}
    runs = Runs(figures, steady, cold, startup, found)
    return report(settings, runs, placements, quick=bool(args.quick))


def _measure(
    url: str, paths: list[str], labels: dict[str, str], concurrency: int, settings: dict[str, Any]
) -> dict[str, Any]:
    started = time.perf_counter()
    served = asyncio.run(
        run_alternating(
            url, paths, concurrency, int(settings["requests_per_client"]), int(settings["max_tokens"]), HEADERS
        )
    )
    wall = time.perf_counter() - started
    level = summarize_level([s for _, s in served], wall, None)
    if level["ttft_ms_p50"] is None:  # nothing to pair with the other side's round: say why
        raise RuntimeError(f"{url}: no request of {concurrency} client(s) was served: {level['first_errors']}")
    by_model: dict[str, Any] = {}
    for path in paths:
        mine = [s for model, s in served if model == path and s.status == 200 and not s.error]
        ttfts = [s.ttft_ms for s in mine if s.ttft_ms is not None]
        by_model[labels[path]] = {
            "served": len(mine),
            "ttft_ms_p50": rounded(percentile(ttfts, 0.5)) if ttfts else None,
        }
    return level | {"by_model": by_model, "retries": sum(s.retries for _, s in served)}


def _measure_steady(url: str, paths: list[str], labels: dict[str, str], settings: dict[str, Any]) -> dict[str, Any]:
    """One client sends each model the requests it gets in an alternating level, all of a model's
    in a row (a request before them, not timed, loads it on mlx_lm.server): the alternating level's
    work without a switch. TTFT percentiles over every request; tokens/s over the timed wall."""
    max_tokens, each = int(settings["max_tokens"]), int(settings["requests_per_client"])
    served: list[tuple[str, Served]] = []
    wall = 0.0
    for path in paths:
        asyncio.run(run_alternating(url, [path], 1, 1, max_tokens, HEADERS))
        started = time.perf_counter()
        served += asyncio.run(run_alternating(url, [path], 1, max(each // len(paths), 1), max_tokens, HEADERS))
        wall += time.perf_counter() - started
    level = summarize_level([s for _, s in served], wall, None)
    by_model = {labels[p]: {"served": sum(1 for m, s in served if m == p and s.status == 200)} for p in paths}
    return level | {"by_model": by_model}


@dataclass(frozen=True, slots=True)
class Runs:
    """What a run measured, every list in round order."""

    figures: dict[str, dict[int, list[dict[str, Any]]]]  # side -> clients -> alternating level per round
    steady: dict[str, list[dict[str, Any]]]  # side -> one client, each model's requests in a row, per round
    cold: dict[str, list[dict[str, Any]]]  # model label -> shoal's cold requests
    startup: dict[str, Warmup | None]  # model label -> its warm-up at `shoal up`
    found: list[Warmup]  # every instance the run placed


def report(settings: dict[str, Any], runs: Runs, placements: dict[str, Any], quick: bool) -> dict[str, Any]:
    figures, cold, startup, found = runs.figures, runs.cold, runs.startup, runs.found
    measures: dict[str, Any] = {}
    comparisons: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for side, levels in figures.items():
        for c, rounds in levels.items():
            measures[f"{side}_c{c}_ttft_p50_ms"] = summarize(_values(rounds, "ttft_ms_p50"), "ms")
            measures[f"{side}_c{c}_ttft_p99_ms"] = summarize(_values(rounds, "ttft_ms_p99"), "ms")
            measures[f"{side}_c{c}_tps"] = summarize(_values(rounds, "aggregate_tps"), "tok/s")
    for side, rounds in runs.steady.items():
        measures[f"{side}_steady_c1_ttft_p50_ms"] = summarize(_values(rounds, "ttft_ms_p50"), "ms")
        measures[f"{side}_steady_c1_tps"] = summarize(_values(rounds, "aggregate_tps"), "tok/s")
    anchor, shoal = figures.get("mlx_lm_server", {}), figures.get("shoal", {})
    if all(runs.steady.get(side) for side in SIDES):
        comparisons["shoal_over_mlx_lm_steady_tps_c1"] = compare(
            _values(runs.steady["shoal"], "aggregate_tps"),
            _values(runs.steady["mlx_lm_server"], "aggregate_tps"),
            "ratio",
            "aggregate tok/s, the same requests without switching, 1 client: shoal / mlx_lm_server",
        )
    if runs.steady.get("mlx_lm_server") and anchor.get(1):
        comparisons.update(_switch_ceilings(anchor[1], runs.steady["mlx_lm_server"]))
    for c in sorted(set(anchor) & set(shoal)):
        ttft = f"mlx_lm_over_shoal_ttft_p50_c{c}"
        comparisons[ttft] = compare(
            _values(anchor[c], "ttft_ms_p50"),
            _values(shoal[c], "ttft_ms_p50"),
            "ratio",
            f"TTFT p50 alternating, {c} client(s): mlx_lm_server / shoal",
        )
        tps = f"shoal_over_mlx_lm_tps_c{c}"
        comparisons[tps] = compare(
            _values(shoal[c], "aggregate_tps"),
            _values(anchor[c], "aggregate_tps"),
            "ratio",
            f"aggregate tok/s alternating, {c} client(s): shoal / mlx_lm_server",
        )
        for name, limit in ((ttft, TARGET_TTFT_RATIO), (tps, TARGET_TPS_RATIO)):
            bound = _switch_bound(comparisons, name) or _load_bound(measures, name, c)
            targets[name] = target(comparisons[name]["median"], ">=", limit, bounded_by=bound)
    own = {w.instance_id: w.ms for w in found}
    for label, colds in cold.items():
        warm = startup.get(label)
        cold_ttfts = [c["ttft_ms"] for c in colds]
        measures[f"{label}_cold_ttft_ms"] = summarize(cold_ttfts, "ms")
        measures[f"{label}_cold_instance_warmup_ms"] = summarize(
            [ms for c in colds if (ms := own.get(c["instance_id"])) is not None], "ms"
        )
        measures[f"{label}_up_warmup_ms"] = summarize([warm.ms] if warm and warm.ms is not None else [], "ms")
        if warm is not None and warm.ms:
            name = f"{label}_cold_ttft_over_up_warmup"
            comparisons[name] = compare(
                cold_ttfts,
                [warm.ms] * len(cold_ttfts),
                "ratio",
                f"{label}: a cold request's TTFT / its warm-up at shoal up (InstancePlaced to every rank ready)",
            )
            targets[name] = target(comparisons[name]["median"], "<=", TARGET_COLD_OVER_WARMUP)
    errors = sum(r["errors"] for rounds in shoal.values() for r in rounds)
    targets["shoal_errors"] = target(errors, "<=", 0)
    headline = [
        *(n for n in comparisons if not n.endswith("_over_up_warmup")),
        *(
            f"{side}_c{c}_ttft_p50_ms"
            for c in sorted(shoal)
            for side in SIDES
            if f"{side}_c{c}_ttft_p50_ms" in measures
        ),
        *(n for n in comparisons if n.endswith("_over_up_warmup")),
        *(f"{label}_{what}" for label in cold for what in ("cold_ttft_ms", "up_warmup_ms")),
    ]
    checks = {
        "every_level_answered_every_request": all(
            r["served"] + r["refused_429"] + r["errors"] == r["requests"]
            for levels in figures.values()
            for rounds in levels.values()
            for r in rounds
        ),
        "both_models_served_in_every_level": all(
            all(m["served"] > 0 for m in r["by_model"].values()) and len(r["by_model"]) == len(cold)
            for levels in figures.values()
            for rounds in levels.values()
            for r in rounds
        ),
        "every_cold_request_placed_a_new_instance": all(c["new_instance"] for colds in cold.values() for c in colds),
        "every_model_warmed_up_at_shoal_up": all(w is not None for w in startup.values()),
    }
    details = {
        "levels": {side: {str(c): rounds for c, rounds in levels.items()} for side, levels in figures.items()},
        "steady": runs.steady,
        "cold": cold,
        "warmups": [
            {
                "instance_id": w.instance_id,
                "model": w.model,
                "placed_seq": w.placed_seq,
                "warmup_ms": w.ms,
                "every_rank_reached_ms": w.phases_ms(),
            }
            for w in found
        ],
        "placements": placements,
    }
    return bench_result(
        "models",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        headline=headline,
        checks=checks,
        details=details,
        notes=_notes(measures, comparisons, targets),
    )


def _switch_ceilings(alternating: list[dict[str, Any]], steady: list[dict[str, Any]]) -> dict[str, Any]:
    """What mlx_lm.server's switching costs it at one client, round by round: the most a server
    that switched for free, and was otherwise exactly as fast as mlx_lm.server, could reach on the
    two 1-client targets (they are bounded by it: a ratio over the target needs shoal faster than
    mlx_lm.server without any switching)."""
    return {
        "ceiling_ttft_p50_c1": compare(
            _values(alternating, "ttft_ms_p50"),
            _values(steady, "ttft_ms_p50"),
            "ratio",
            "mlx_lm_server's TTFT p50 alternating / without switching, 1 client: the TTFT ratio a free switch gives",
        ),
        "ceiling_tps_c1": compare(
            _values(steady, "aggregate_tps"),
            _values(alternating, "aggregate_tps"),
            "ratio",
            "mlx_lm_server's tok/s without switching / alternating, 1 client: the tok/s ratio a free switch gives",
        ),
    }


def _values(rounds: list[dict[str, Any]], key: str) -> list[float]:
    """`key` of each round, in round order (round i of two sides are paired)."""
    return [float(r[key]) for r in rounds]


def _notes(measures: dict[str, Any], comparisons: dict[str, Any], targets: dict[str, Any]) -> list[str]:
    """Sentences for the README, from this run's medians only."""

    def ms(name: str) -> str:
        value = (measures.get(name) or {}).get("median")
        return "none" if value is None else readable(value)

    notes = [
        "cold load on demand = one streamed request after `POST /v1/admin/models/unload` (once `/v1/models` says "
        "`unloaded`), TTFT from sending it to its first token; `up_warmup` = the model's first instance at `shoal up`, "
        "from its `InstancePlaced` to every rank ready (`RunnerStatusChanged`), by the log's wall times; the cold "
        "instance's own warm-up (same definition) was "
        + ", ".join(
            f"{ms(f'{label}_cold_instance_warmup_ms')} ms of {label}'s {ms(f'{label}_cold_ttft_ms')} ms"
            for label in (name.removesuffix("_cold_ttft_ms") for name in measures if name.endswith("_cold_ttft_ms"))
        )
        + " (runner start, load, warm-up: `details.warmups` splits each)."
    ]
    if "mlx_lm_server_steady_c1_ttft_p50_ms" in measures and "mlx_lm_server_c1_ttft_p50_ms" in measures:
        notes.append(
            f"switching models: mlx_lm.server's TTFT p50 at 1 client is {ms('mlx_lm_server_c1_ttft_p50_ms')} ms "
            f"alternating against {ms('mlx_lm_server_steady_c1_ttft_p50_ms')} ms for the same requests without "
            f"switching (it reloads on each switch); shoal's {ms('shoal_c1_ttft_p50_ms')} ms against "
            f"{ms('shoal_steady_c1_ttft_p50_ms')} ms."
        )
    missed = [name for name, judged in targets.items() if not judged["met"]]
    bounded = [name for name in missed if name.endswith("_c1") and f"ceiling_{_kind(name)}_c1" in comparisons]
    if bounded:  # each target's own note gives its ceiling (`_switch_bound`); this says what lies past it
        notes.append(
            f"not met: {', '.join(bounded)}, each bounded by mlx_lm.server's own switch (its note). Past that "
            "ceiling a ratio needs shoal faster than mlx_lm.server with no switching at all (shoal / mlx_lm.server "
            f"without switching: {_median(comparisons, 'shoal_over_mlx_lm_steady_tps_c1')} x tok/s, TTFT p50 "
            f"{ms('shoal_steady_c1_ttft_p50_ms')} ms against {ms('mlx_lm_server_steady_c1_ttft_p50_ms')} ms). The "
            "switch is a reload of small random models, fast next to a request; with models whose reload takes "
            "seconds the same bench would judge the cost of switching, which is what the targets aim at."
        )
    if other := [name for name in missed if name not in bounded]:
        notes.append(f"not met: {', '.join(other)}.")
    return notes


def _switch_bound(comparisons: dict[str, Any], target_name: str) -> str:
    """At one client: the ceiling mlx_lm.server's own switch sets (`_switch_ceilings`), where measured."""
    ceiling = f"ceiling_{_kind(target_name)}_c1"
    if not target_name.endswith("_c1") or ceiling not in comparisons:
        return ""
    return (
        f"mlx_lm.server's switch costs it only {_ceiling(comparisons, target_name)} on these models ({ceiling}): "
        "a server that switched for free and was otherwise as fast as it would reach no more"
    )


def _load_bound(measures: dict[str, Any], target_name: str, clients: int) -> str:
    """Above one client: the ratio at `clients` split into the sides' ratio at one client (bounded
    by mlx_lm.server's own switch) and how each side's figure changed from one client to `clients`
    (shoal batches its clients' requests), from the sides' medians."""
    metric = "ttft_p50_ms" if _kind(target_name) == "ttft_p50" else "tps"
    figures = {
        side: (
            measures.get(f"{side}_c1_{metric}", {}).get("median"),
            measures.get(f"{side}_c{clients}_{metric}", {}).get("median"),
        )
        for side in SIDES
    }
    if clients == 1 or not all(one and many for one, many in figures.values()):
        return ""
    (anchor_1, anchor_c), (shoal_1, shoal_c) = figures["mlx_lm_server"], figures["shoal"]
    ttft = metric == "ttft_p50_ms"
    what, unit = ("TTFT p50", " ms") if ttft else ("aggregate tok/s", " tok/s")
    at_one, at_many = (anchor_1 / shoal_1, anchor_c / shoal_c) if ttft else (shoal_1 / anchor_1, shoal_c / anchor_c)
    return (
        f"in medians, {readable(at_many)} x (the judged figure is the median of the rounds' ratios) is the "
        f"sides' ratio at 1 client ({readable(at_one)} x, bounded by mlx_lm.server's own switch) times how much "
        f"better shoal's {what} scaled from 1 to {clients} clients: mlx_lm.server's went {readable(anchor_1)} -> "
        f"{readable(anchor_c)}{unit} ({readable(anchor_c / anchor_1)} x), shoal's "
        f"{readable(shoal_1)} -> {readable(shoal_c)}{unit} ({readable(shoal_c / shoal_1)} x, its requests batched)"
    )


def _kind(target_name: str) -> str:
    return "ttft_p50" if "ttft" in target_name else "tps"


def _ceiling(comparisons: dict[str, Any], target_name: str) -> str:
    return f"{_median(comparisons, f'ceiling_{_kind(target_name)}_c1')} x"


def _median(comparisons: dict[str, Any], name: str) -> str:
    value = (comparisons.get(name) or {}).get("median")
    return "none" if value is None else readable(value)
