"""`shoal bench batch`: what a newcomer's prefill and a cancel cost the streams of a running batch.

Engine level, on local ring groups of 1 and 2 ranks (no NATS, no HTTP: the least noise), one
group per world size running every schedule one after another (`runner.local.testing.schedule`, test-only: run from a checkout; whose
ranks timestamp each token, step, cancel and departure on one monotonic clock). The group's first
batch teaches the engine its pace before it runs, as `shoal up` does before it is ready
(`runner.engine.batch_warmup`); the pace carries over from schedule to schedule:
- interference: K streams decode; a newcomer with a long prompt joins at step `ARRIVAL`. In
  rotating rounds the same schedule runs with and without the newcomer, and a prompt of one
  prefill chunk runs alone (its time to first token: one chunk through every rank), and so does
  the newcomer's prompt (sequentially, in a batch of its own: its chunks are pipelined through the
  ranks, so a chunk's time is that of `world` consecutive steps, and the last ones attend to the
  whole prompt). The running streams' inter-token p99 (the gaps that
  end after step `ARRIVAL`, on the sampling rank) with and without the newcomer; target: the
  increase is at most one prefill chunk's time (the lone first chunk; and the slowest chunk).
- a slow grammar: the same K streams, and at step `ARRIVAL` a newcomer whose JSON schema takes its
  ranks about half a second to check and compile (`runner.engine.preparation`), prepared off the
  step loop as a runner does, and on it (as before: the step that admits it does the work). The
  running streams' longest inter-token gap after `ARRIVAL` against the same without a newcomer;
  target: at most one prefill chunk's time more.
- cancel 1 of 16: 16 streams decode; in each schedule one of them (a random one, at a random
  step) is cancelled: its cancel source flips before that step on every rank, as a cancel read
  from the log would, and the batch polls it at every step. The other 15 streams' tokens
  must equal those of the same schedule without the cancel; the time from the flip to the step
  at which the batch lets the slot go, on the slowest rank, p99 against one step + 50 ms.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
from pathlib import Path
from typing import Any

from bench.options import Sized, add_sized, resolve
from bench.result import bench_result, median_text
from bench.rounds import rotated
from bench.stats import compare, percentile, summarize, tail, target

ABOUT = (
    "continuous batch on 1 and 2 local ranks (tiny model): running streams' inter-token p99 with a long newcomer's "
    "prefill vs without, against one prefill chunk; a newcomer's slow grammar prepared off the step loop vs on it; "
    "cancelling 1 of 16 streams: others unchanged, slot free time"
)
SIZED = (
    Sized("--rounds", 4, 1, "interference rounds; each runs the schedule with and without the newcomer"),
    Sized("--cancels", 50, 2, "cancel schedules per world size, one of 16 streams cancelled in each"),
    Sized("--newcomer-tokens", 2000, 600, "the newcomer's prompt length"),
)
WORLDS = (1, 2)
ARRIVAL = 8  # the step at which the newcomer joins: every running stream decodes by then
PROMPT = 8  # the running streams' prompt length
CANCEL_STREAMS = 16
CANCEL_STEPS = (4, 16)  # the cancel flips this many steps after the last stream's prefill (inclusive)
SLACK_MS = 50.0
GRAMMAR_ALTERNATIVES = 400  # the slow schema's size: ~0.35 s of checks on every rank, ~0.2 s more to compile
NEWCOMERS = ("newcomer", "grammar")


def _slow_constraint() -> dict[str, Any]:
    """The newcomer's constraint: a JSON schema llguidance takes long to turn into a grammar."""
    from runner.local.testing.tools import slow_json_schema

    return {"kind": "json_schema", "name": "slow", "schema": json.dumps(slow_json_schema(GRAMMAR_ALTERNATIVES))}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--streams", type=int, default=4, help="running streams a newcomer joins")
    parser.add_argument("--stream-tokens", type=int, default=48, help="max_tokens of every running stream")
    parser.add_argument("--step", type=int, default=256, help="prefill_step_size (the engine divides it by ranks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="model dir (default: the tiny model)")
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds one group run may take")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from runner.local.launch import run_group
    from runner.models.tiny import cached_tiny

    settings = resolve(args, SIZED) | {
        "streams": args.streams,
        "stream_tokens": args.stream_tokens,
        "step": args.step,
        "seed": args.seed,
        "worlds": list(WORLDS),
    }
    model_dir = Path(args.model) if args.model else cached_tiny()
    rng = random.Random(args.seed)
    per_world = {}
    for world in WORLDS:
        plan = _plan(settings, world, rng)
        ranks = run_group(_job(model_dir, world, settings, plan), world, args.deadline)
        for rank in ranks:
            if "results" not in rank:
                raise RuntimeError(f"rank failed on {world} ranks: {rank}")
        per_world[world] = _measure(plan, [rank["results"] for rank in ranks])
    return _report(settings, per_world, str(model_dir), quick=bool(args.quick))


def _prompt(length: int, shift: int) -> list[int]:
    """Distinct prompts per stream (the synthetic run from another offset), so no prefix is shared."""
    from runner.local.local_run import synthetic_prompt

    return synthetic_prompt(length + shift)[shift:]


def _request(task_id: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_token_ids": prompt, "max_tokens": max_tokens}


def _sequential(entry: dict[str, Any]) -> dict[str, Any]:
    return {"request": {**entry["request"], "prefill_path": "sequential"}, "at": 0}


def _plan(settings: dict[str, Any], world: int, rng: random.Random) -> list[dict[str, Any]]:
    """The job's tasks in order, each tagged with what it measures (`role`)."""
    from runner.engine.plan import effective_step

    chunk = effective_step(settings["step"], world)
    running = [
        {"request": _request(f"s{i}", _prompt(PROMPT, 1 + i), settings["stream_tokens"]), "at": 0}
        for i in range(settings["streams"])
    ]
    newcomer = {"request": _request("newcomer", _prompt(settings["newcomer_tokens"], 100), 4), "at": ARRIVAL}
    grammar = {
        "request": {**_request("grammar", _prompt(PROMPT, 200), 4), "constraint": _slow_constraint()},
        "at": ARRIVAL,
    }
    width = settings["streams"] + 1
    sides = {
        "with": {"kind": "batch", "max_batch": width, "tasks": [*running, newcomer]},
        "without": {"kind": "batch", "max_batch": width, "tasks": running},
        "grammar": {"kind": "batch", "max_batch": width, "tasks": [*running, grammar]},
        "grammar_on_loop": {"kind": "batch", "max_batch": width, "tasks": [*running, grammar], "prepare_on_loop": True},
        "chunk": {"request": {**_request("chunk", _prompt(chunk, 150), 1), "prefill_path": "sequential"}},
        "alone": {"kind": "batch", "max_batch": 1, "tasks": [_sequential(newcomer)]},
    }
    plan = [{**sides[side], "role": side} for r in range(settings["rounds"]) for side in rotated(list(sides), r)]
    first = next(i for i, task in enumerate(plan) if task.get("kind") == "batch")
    plan[first] = {**plan[first], "warm_pace": True}  # as the service does once, before it is ready
    streams = [
        {"request": _request(f"c{i}", _prompt(PROMPT, 1 + i), CANCEL_STREAMS + CANCEL_STEPS[1] + 16), "at": 0}
        for i in range(CANCEL_STREAMS)
    ]
    plan.append({"kind": "batch", "max_batch": CANCEL_STREAMS, "tasks": streams, "role": "reference"})
    for _ in range(settings["cancels"]):
        victim, at = rng.randrange(CANCEL_STREAMS), CANCEL_STREAMS + rng.randint(*CANCEL_STEPS)
        tasks = [{**entry, "cancel_at_step": at} if i == victim else entry for i, entry in enumerate(streams)]
        cancel = {"role": "cancel", "victim": f"c{victim}", "cancel_step": at}
        plan.append({"kind": "batch", "max_batch": CANCEL_STREAMS, "tasks": tasks, **cancel})
    return plan


def _job(model_dir: Path, world: int, settings: dict[str, Any], plan: list[dict[str, Any]]) -> dict[str, Any]:
    from runner.engine.plan import even_split
    from runner.models.model_info import read_model_info

    return {
        "model_dir": str(model_dir),
        "testing": True,  # its tasks are run by the test-only runner.local.testing
        "layer_ranges": even_split(read_model_info(model_dir).n_layers, world),
        # Every token reaches the sink as it is decoded: the inter-token times are the schedule's,
        # not those of a fast stream's chunks held to `stream_chunk_min_interval_seconds` (25 ms,
        # longer than a step of 4 tiny streams here), which would quantize both sides' gaps.
        "settings": {"prefill_step_size": settings["step"], "stream_chunk_min_interval_seconds": 0.0},
        "warmup": True,
        "tasks": plan,
    }


def _slowest_chunk_ms(step_times: list[tuple[float, float]], world: int) -> float:
    """The newcomer's slowest chunk through every rank, alone: its chunks are pipelined (a chunk taken
    at step t is computed by rank r at step t + r, each step holding one part of a chunk per rank),
    so a chunk's time is that of `world` consecutive steps; the slowest such window."""
    durations = [(end - start) * 1000 for start, end in step_times]
    windows = [sum(durations[i : i + world]) for i in range(max(1, len(durations) - world + 1))]
    return max(windows)


def _measure(plan: list[dict[str, Any]], ranks: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per world: the interference rounds' p99s, the chunk times, the cancels' latencies and checks."""
    by_role: dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = {}
    for index, task in enumerate(plan):
        by_role.setdefault(task["role"], []).append((task, [results[index] for results in ranks]))
    sampling = -1  # the last rank samples: its sinks get the tokens
    itl = {
        side: [_window_gap(views[sampling], task, 0.99) for task, views in by_role[side]]
        for side in ("with", "without")
    }
    longest = {
        side: [_window_gap(views[sampling], task, 1.0) for task, views in by_role[side]]
        for side in ("without", "grammar", "grammar_on_loop")
    }
    chunk_ms = [max(view["ttft_ms"] for view in views) for _, views in by_role["chunk"]]
    slowest_ms = [_slowest_chunk_ms(views[sampling]["step_times"], len(ranks)) for _, views in by_role["alone"]]
    reference = by_role["reference"][0][1]
    step_ms = _decode_step_ms(reference[sampling])
    cancels = [_cancel(task, views, reference) for task, views in by_role["cancel"]]
    return {
        "itl": itl,
        "longest_gap": longest,
        "chunk_ms": chunk_ms,
        "slowest_chunk_ms": slowest_ms,
        "step_ms": step_ms,
        "cancels": cancels,
    }


def _window_gap(run: dict[str, Any], task: dict[str, Any], q: float) -> float:
    """The q-quantile (1.0: the longest) of the running streams' inter-token gaps (ms) that end after
    step ARRIVAL started."""
    since = run["step_times"][ARRIVAL][0]
    gaps = []
    for entry in task["tasks"]:
        task_id = entry["request"]["task_id"]
        if task_id in NEWCOMERS:
            continue
        times = run["ended"][task_id]["sink"]["token_times"]
        gaps += [(b - a) * 1000 for a, b in itertools.pairwise(times) if b >= since]
    return percentile(gaps, q)


def _decode_step_ms(run: dict[str, Any]) -> float:
    """Median step time once every stream decodes (after the last one's prefill step)."""
    return statistics.median((end - start) * 1000 for start, end in run["step_times"][CANCEL_STREAMS:])


def _cancel(task: dict[str, Any], views: list[dict[str, Any]], reference: list[dict[str, Any]]) -> dict[str, Any]:
    victim = task["victim"]
    timings = [view["ended"][victim]["timing"] for view in views]
    others_unchanged = all(
        view["ended"][t]["token_ids"] == ref["ended"][t]["token_ids"]
        for view, ref in zip(views, reference, strict=True)
        for t in ref["ended"]
        if t != victim
    )
    return {
        "cancelled": all(view["ended"][victim]["finish_reason"] == "cancelled" for view in views),
        "others_unchanged": others_unchanged,
        "flip_to_free_ms": max((t["left_at"] - t["cancel_flipped_at"]) * 1000 for t in timings),
        "seen_to_free_ms": max((t["left_at"] - t["cancel_seen_at"]) * 1000 for t in timings),
        "steps_to_free": max(t["left_step"] for t in timings) - task["cancel_step"],
    }


def _report(settings: dict[str, Any], per_world: dict[int, dict[str, Any]], model: str, quick: bool) -> dict[str, Any]:
    measures: dict[str, Any] = {}
    comparisons: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    for world, got in per_world.items():
        w = f"{world}r"
        itl, cancels = got["itl"], got["cancels"]
        chunk = statistics.median(got["chunk_ms"])
        measures[f"itl_p99_without_ms_{w}"] = summarize(itl["without"], "ms")
        measures[f"itl_p99_with_ms_{w}"] = summarize(itl["with"], "ms")
        measures[f"chunk_ms_{w}"] = summarize(got["chunk_ms"], "ms")
        measures[f"slowest_chunk_ms_{w}"] = summarize(got["slowest_chunk_ms"], "ms")
        comparisons[f"itl_p99_increase_ms_{w}"] = compare(
            itl["with"], itl["without"], "difference", "with newcomer - without", "ms"
        )
        increase = comparisons[f"itl_p99_increase_ms_{w}"]["median"]
        slowest = statistics.median(got["slowest_chunk_ms"])
        account = _newcomer_account(
            statistics.median(itl["with"]), statistics.median(itl["without"]), chunk, slowest, increase
        )
        targets[f"itl_p99_increase_{w}"] = target(increase, "<=", round(chunk, 2), "ms", bounded_by=account)
        targets[f"itl_p99_increase_vs_slowest_chunk_{w}"] = target(
            increase, "<=", round(slowest, 2), "ms", bounded_by=account
        )
        longest = got["longest_gap"]
        for side in ("without", "grammar", "grammar_on_loop"):
            measures[f"{side}_itl_max_ms_{w}"] = summarize(longest[side], "ms")
        for side in ("grammar", "grammar_on_loop"):
            comparisons[f"{side}_itl_max_increase_ms_{w}"] = compare(
                longest[side], longest["without"], "difference", f"{side} - without", "ms"
            )
        grammar_increase = comparisons[f"grammar_itl_max_increase_ms_{w}"]["median"]
        targets[f"grammar_itl_max_increase_{w}"] = target(grammar_increase, "<=", round(chunk, 2), "ms")
        landed = [c for c in cancels if c["cancelled"]]
        free = [c["flip_to_free_ms"] for c in landed]
        measures[f"cancel_to_free_ms_{w}"] = summarize(free, "ms") | {"p99": tail(free, 0.99)}
        measures[f"seen_to_free_ms_{w}"] = summarize([c["seen_to_free_ms"] for c in landed], "ms")
        measures[f"steps_to_free_{w}"] = summarize([c["steps_to_free"] for c in landed], "steps")
        measures[f"decode_step_ms_{w}"] = summarize([got["step_ms"]], "ms")
        targets[f"cancel_free_p99_{w}"] = target(
            measures[f"cancel_to_free_ms_{w}"]["p99"]["value"], "<=", round(got["step_ms"] + SLACK_MS, 2), "ms"
        )
        checks[f"others_unchanged_{w}"] = all(c["others_unchanged"] for c in cancels)
        checks[f"every_cancel_landed_{w}"] = len(landed) == len(cancels)
    return bench_result(
        "batch",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        headline=[
            name
            for world in per_world
            for name in (
                f"itl_p99_without_ms_{world}r",
                f"itl_p99_with_ms_{world}r",
                f"itl_p99_increase_ms_{world}r",
                f"chunk_ms_{world}r",
                f"slowest_chunk_ms_{world}r",
                f"grammar_itl_max_increase_ms_{world}r",
                f"grammar_on_loop_itl_max_increase_ms_{world}r",
                f"cancel_to_free_ms_{world}r",
                f"decode_step_ms_{world}r",
            )
        ],
        notes=_notes(measures, comparisons, per_world, settings),
        checks=checks,
        details={
            "model": model,
            "arrival_step": ARRIVAL,
            "cancel_streams": CANCEL_STREAMS,
            "cancels": {world: got["cancels"] for world, got in per_world.items()},
        },
    )


def _newcomer_account(with_p99: float, without_p99: float, chunk: float, slowest: float, increase: float | None) -> str:
    """What bounds a newcomer's cost to the running streams, from this run's medians: a stream's
    p99 gap is the step that runs the newcomer's slowest chunk beside the batch's decode."""
    if increase is None:
        return "no increase was measured"
    beside = with_p99 - slowest
    return (
        f"the streams' p99 gap with the newcomer ({with_p99:.1f} ms) is the step that runs its slowest chunk, not a "
        f"median one: late chunks attend to the whole prompt before them ({slowest:.1f} ms alone against "
        f"{chunk:.1f} ms); that step also decodes the running rows, {beside:.1f} ms beyond the chunk alone, "
        f"against a whole decode gap of {without_p99:.1f} ms (p99) without the newcomer"
    )


def _notes(
    measures: dict[str, Any],
    comparisons: dict[str, Any],
    per_world: dict[int, dict[str, Any]],
    settings: dict[str, Any],
) -> list[str]:
    def median(name: str) -> str:
        return median_text(measures, comparisons, name)

    notes = []
    for world in per_world:
        w = f"{world}r"
        p99 = measures[f"cancel_to_free_ms_{w}"]["p99"]
        notes += [
            f"{world} rank(s): a {settings['newcomer_tokens']}-token newcomer raises {settings['streams']} running "
            f"streams' inter-token p99 from {median(f'itl_p99_without_ms_{w}')} to {median(f'itl_p99_with_ms_{w}')} "
            f"ms (+{median(f'itl_p99_increase_ms_{w}')} ms per round, median) against one prefill chunk's "
            f"{median(f'chunk_ms_{w}')} ms alone (the newcomer's slowest chunk alone: "
            f"{median(f'slowest_chunk_ms_{w}')} ms).",
            f"{world} rank(s): a newcomer with a slow grammar ({GRAMMAR_ALTERNATIVES} schema alternatives) raises the "
            f"running streams' longest inter-token gap from {median(f'without_itl_max_ms_{w}')} ms to "
            f"{median(f'grammar_itl_max_ms_{w}')} ms prepared off the step loop "
            f"(+{median(f'grammar_itl_max_increase_ms_{w}')} ms per round), and to "
            f"{median(f'grammar_on_loop_itl_max_ms_{w}')} ms prepared on it "
            f"(+{median(f'grammar_on_loop_itl_max_increase_ms_{w}')} ms).",
            f"{world} rank(s): cancelling 1 of {CANCEL_STREAMS} frees its slot {median(f'cancel_to_free_ms_{w}')} ms "
            f"(p99 {p99['value']}{' = the max' if p99['is_max'] else ''}) after the cancel flips, polled at every "
            f"step ({median(f'steps_to_free_{w}')} steps, a step "
            f"{median(f'decode_step_ms_{w}')} ms); {median(f'seen_to_free_ms_{w}')} ms from the poll that saw it.",
        ]
    return notes
