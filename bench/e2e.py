"""`shoal bench e2e`: time to first token and decode rate, bare mlx-lm vs through shoal, interleaved.

Three sides stay up for the whole run: bare mlx-lm `stream_generate` (a subprocess with a
1-rank runner's BLAS environment and compute CPU pinning, `bench.bare_mlx`), `shoal up --workers 1`
and `shoal up --workers 2`, both reached with the official openai client; bare mlx-lm unpinned is a
side of its own, so what the pinning is worth is measured, not folded into a ratio, and so is
`shoal up --workers 1` with `pin_runner_threads: false`, read against it: the same pinning, none. After a
warm-up, each round sends every side two requests (the order of the sides rotates per round), so a
neighbour's load lands on all of them; the ratios and differences are taken per round and their
medians judged. The first request is cold: its prompt starts with a prefix no side has seen (one
per side and round, of the same token count), so its TTFT includes the prompt's prefill on every
side alike, and the judged TTFT overhead and decode rates are this request's. The second is warm:
the prompt of the warm-up again, which shoal's prefix cache (on by default) answers from cached KV
and bare mlx-lm prefills again; its TTFT is reported apart and never judged against a cold one.
A fourth side sends the 1-worker request with `logprobs` and `top_logprobs=5`: its decode rate
over the plain request's, per round, is what logprobs cost per token; two more, under a json_schema
constraint and with logit adjustments (`logit_bias`, both penalties), what those cost. And the
least a pipeline of two processes costs (`bench.bare_pipeline`: the model's two halves on a
2-rank mlx ring, nothing but the forward, the hop and the argmax): the 2-worker side's decode
rate over it is what shoal adds to a 2-rank pipeline, and its rate over bare mlx-lm's what the
split itself costs on this machine. And shoal's engine alone (`bench.engine_alone`: a 1-rank
runner's decode loop in one process, no services): its rate over bare mlx-lm's is what the decode
loop costs, and the 1-worker side's over it what serving adds (events, NATS, the API, HTTP, the
client), so a run says where the 1-worker side's milliseconds go.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from bench.bare_mlx import bare_mlx
from bench.bare_pipeline import BarePipeline
from bench.cluster import Cluster
from bench.engine_alone import engine_alone
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result, readable
from bench.rounds import run_rounds
from bench.stats import compare, summarize, target

PROMPT = "Write a long story about a river, a stone and a lantern."
ABOUT = (
    "streamed chat requests after warm-up, interleaved per round, each side a cold request (a prompt prefix no "
    "side has seen: TTFT and decode judged on it) and a warm one (the warm-up's prompt: shoal's prefix cache, "
    "reported apart): bare mlx-lm `stream_generate` pinned as shoal's runners are (and unpinned, a side of its own) vs "
    "`shoal up --workers 1` and `--workers 2` through the openai client (tiny model), and 1 worker with "
    "pin_runner_threads false against bare mlx-lm unpinned; 1 worker with "
    "logprobs (top_logprobs=5); and 1 worker under a json_schema constraint and with logit_bias and "
    "penalties, for the per-token cost of constrained decoding and of logit adjustments; and bare mlx "
    "on a 2-rank ring (the model's halves, one hop each way per token), what a 2-rank pipeline costs "
    "before shoal adds anything; and shoal's engine alone (a 1-rank runner's decode loop in one process, "
    "no services), which splits the 1-worker side's cost into the decode loop's and serving's"
)
SIZED = (
    Sized("--rounds", 20, 1, "rounds; each sends every side a cold request and a warm one"),
    Sized("--max-tokens", 64, 16, "tokens to generate per request"),
    Sized("--warmup", 2, 1, "unmeasured requests per side before the rounds"),
)
SIDES = (
    "bare_mlx_lm",
    "bare_mlx_lm_unpinned",
    "bare_mlx_pipeline_2r",
    "shoal_engine_alone",
    "shoal_1w",
    "shoal_2w",
    "shoal_1w_logprobs",
    "shoal_1w_unpinned",
)
# The side measured on its own prompt only: its prefill runs through the whole model on both ranks
# and is not what it stands for (its TTFT is not compared).
PIPELINE_SIDE = "bare_mlx_pipeline_2r"
# (comparison, side, the side it is read against): decode rate ratios per round.
DECODE_RATIOS = (
    ("decode_ratio_2w_over_bare_pipeline", "shoal_2w", "bare_mlx_pipeline_2r"),
    ("bare_pipeline_decode_ratio", "bare_mlx_pipeline_2r", "bare_mlx_lm"),
    ("bare_pinned_over_unpinned_decode_ratio", "bare_mlx_lm", "bare_mlx_lm_unpinned"),
    ("engine_alone_decode_ratio", "shoal_engine_alone", "bare_mlx_lm"),
    ("decode_ratio_1w_over_engine_alone", "shoal_1w", "shoal_engine_alone"),
    ("logprobs_decode_ratio_1w", "shoal_1w_logprobs", "shoal_1w"),
    ("decode_ratio_1w_unpinned", "shoal_1w_unpinned", "bare_mlx_lm_unpinned"),  # the same pinning: none
    ("unpinned_over_pinned_decode_ratio_1w", "shoal_1w_unpinned", "shoal_1w"),  # what `pin_runner_threads` is worth
)
LOGPROBS = {"logprobs": True, "top_logprobs": 5}
JSON_SCHEMA_SIDE = "shoal_1w_json_schema"
ADJUSTED_SIDE = "shoal_1w_adjusted"
# Small enough not to change how many tokens a request writes (the plain side's run to max_tokens).
ADJUSTMENTS = {"logit_bias": {"42": 0.5, "7": -0.5}, "frequency_penalty": 0.2, "presence_penalty": 0.1}
# One string longer than any run's max_tokens can write, so every constrained answer runs to
# max_tokens as the unconstrained ones do, each token masked by the grammar.
STORY_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "story",
        "schema": {
            "type": "object",
            "properties": {"story": {"type": "string", "minLength": 10_000}},
            "required": ["story"],
        },
    },
}
DECODE_RATIO_MIN = 1.0  # issue 45: single-stream decode >= 1.0x bare mlx-lm given the same pinning
TTFT_OVERHEAD_MAX_MS = 10.0  # issue 45: cold TTFT overhead <= 10 ms
# Letters the tiny tokenizer's merges never saw (its corpus has none of them): each is one token
# whatever its neighbours, so every cold prefix has the same token count.
COLD_ALPHABET = "BDGJKLMNOQRUVXYZ"
COLD_DIGITS = 6


class Sample(NamedTuple):
    ttft_ms: float
    decode_tps: float
    tokens: int


class Pair(NamedTuple):
    """One round of a side: its cold request (a prompt never seen) and its warm one (None on a side
    measured on its own prompt only)."""

    cold: Sample
    warm: Sample | None


def cold_prompt(round_index: int, side_index: int, sides: int) -> str:
    """PROMPT behind a prefix unique to the round and the side (of `sides`), of one token count for all."""
    number, letters = round_index * sides + side_index, []
    for _ in range(COLD_DIGITS):
        number, digit = divmod(number, len(COLD_ALPHABET))
        letters.append(COLD_ALPHABET[digit])
    if number:
        raise ValueError(f"round {round_index}: more rounds than {COLD_DIGITS} letters can number")
    return f"{''.join(letters)} {PROMPT}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--prefill-step", type=int, default=256)


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED) | {"prefill_step": args.prefill_step, "prompt": PROMPT}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-e2e-") as root, contextlib.ExitStack() as stack:
        env = {**os.environ, "SHOAL_DATA_DIR": str(Path(root) / "data")}
        model_dir = _tiny_dir(env)
        pinned = [_cluster(Path(root), workers, args.prefill_step) for workers in (1, 2)]
        unpinned_cluster = _cluster(Path(root), 1, args.prefill_step, pinned=False)
        clusters = [*pinned, unpinned_cluster]
        for cluster in clusters:
            stack.callback(cluster.stop)
        bare = stack.enter_context(
            bare_mlx(env, model_dir, PROMPT, settings["max_tokens"], args.prefill_step, Path(root))
        )
        pipeline = stack.enter_context(BarePipeline(env, model_dir, PROMPT, settings["max_tokens"], Path(root)))
        engine = stack.enter_context(
            engine_alone(env, model_dir, PROMPT, settings["max_tokens"], args.prefill_step, Path(root))
        )
        for cluster in clusters:
            cluster.wait_ready(timeout=300)
        unpinned = stack.enter_context(
            bare_mlx(env, model_dir, PROMPT, settings["max_tokens"], args.prefill_step, Path(root), pinned=False)
        )
        sides: dict[str, Callable[[str | None], Sample]] = {
            "bare_mlx_lm": lambda prompt: Sample(**bare.generate(prompt)),
            "bare_mlx_lm_unpinned": lambda prompt: Sample(**unpinned.generate(prompt)),
            PIPELINE_SIDE: lambda _: Sample(**pipeline.generate()),
            "shoal_engine_alone": lambda prompt: Sample(**engine.generate(prompt)),
        }
        for workers, cluster in zip((1, 2), pinned, strict=True):
            sides[f"shoal_{workers}w"] = partial(_one_request, cluster.client(timeout=120), settings["max_tokens"])
        sides["shoal_1w_unpinned"] = partial(_one_request, unpinned_cluster.client(timeout=120), settings["max_tokens"])
        sides["shoal_1w_logprobs"] = partial(
            _one_request, pinned[0].client(timeout=120), settings["max_tokens"], **LOGPROBS
        )
        sides[JSON_SCHEMA_SIDE] = _json_schema_side(pinned[0], settings["max_tokens"])
        sides[ADJUSTED_SIDE] = partial(
            _one_request, pinned[0].client(timeout=120), settings["max_tokens"], **ADJUSTMENTS
        )
        rounds = {
            name: _cold_then_warm(name, index, len(sides), side) for index, (name, side) in enumerate(sides.items())
        }
        for one_round in rounds.values():  # warm-up: its own prompt and a cold one's shape, not measured
            for _ in range(settings["warmup"]):
                one_round()
        samples = run_rounds(rounds, settings["rounds"])
    return _report(settings, samples, quick=bool(args.quick))


def _cluster(root: Path, workers: int, prefill_step: int, pinned: bool = True) -> Cluster:
    """`pinned`: the runners' `pin_runner_threads` (shoal's default: true)."""
    home = root / f"w{workers}{'' if pinned else '-unpinned'}"
    home.mkdir(parents=True)
    return Cluster(
        home,
        workers=workers,
        prefill_step_size=str(prefill_step),
        log_level="WARNING",
        pin_runner_threads=str(pinned).lower(),
    )


def _tiny_dir(env: dict[str, str]) -> str:
    code = "from runner.models.tiny import cached_tiny; print(cached_tiny())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _cold_then_warm(name: str, index: int, sides: int, side: Callable[[str | None], Sample]) -> Callable[[], Pair]:
    """A round of side `name` (the `index`-th of `sides`): a cold request, then (but on the pipeline
    side) a warm one."""
    rounds = iter(range(1 << 30))

    def one_round() -> Pair:
        cold = side(None if name == PIPELINE_SIDE else cold_prompt(next(rounds), index, sides))
        return Pair(cold, None if name == PIPELINE_SIDE else side(None))

    return one_round


def _json_schema_side(cluster: Cluster, max_tokens: int) -> Callable[[str | None], Sample]:
    """The 1-worker side again, its output held to a JSON schema by the sampling rank's grammar."""
    return partial(_one_request, cluster.client(timeout=120), max_tokens, response_format=STORY_FORMAT)


def _one_request(client: Any, max_tokens: int, prompt: str | None, **extra: Any) -> Sample:
    started = time.perf_counter()
    first = last = started
    count = 0
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": prompt or PROMPT}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
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
    return Sample((first - started) * 1000, rate, count)


def _report(settings: dict[str, Any], samples: dict[str, list[Pair]], quick: bool) -> dict[str, Any]:
    cold = {side: [pair.cold for pair in pairs] for side, pairs in samples.items()}
    ttft = {side: [s.ttft_ms for s in cold[side]] for side in SIDES}
    warm_ttft = {
        side: [pair.warm.ttft_ms for pair in samples[side] if pair.warm is not None]
        for side in SIDES
        if side != PIPELINE_SIDE
    }
    decode = {side: [s.decode_tps for s in cold[side]] for side in SIDES}
    measures: dict[str, Any] = {}
    for side in SIDES:
        measures[f"{side}_cold_ttft_ms"] = summarize(ttft[side], "ms")
        if side in warm_ttft:
            measures[f"{side}_warm_ttft_ms"] = summarize(warm_ttft[side], "ms")
        measures[f"{side}_decode_tps"] = summarize(decode[side], "tok/s")
    comparisons: dict[str, Any] = {}
    for workers in (1, 2):
        side = f"shoal_{workers}w"
        comparisons[f"decode_ratio_{workers}w"] = compare(
            decode[side], decode["bare_mlx_lm"], "ratio", f"{side}_decode_tps / bare_mlx_lm_decode_tps"
        )
        comparisons[f"cold_ttft_overhead_ms_{workers}w"] = compare(
            ttft[side], ttft["bare_mlx_lm"], "difference", f"{side}_cold_ttft_ms - bare_mlx_lm_cold_ttft_ms", "ms"
        )
    for name, side, over in DECODE_RATIOS:
        comparisons[name] = compare(decode[side], decode[over], "ratio", f"{side}_decode_tps / {over}_decode_tps")
    comparisons["engine_alone_cold_ttft_overhead_ms"] = compare(
        ttft["shoal_engine_alone"], ttft["bare_mlx_lm"], "difference", "engine alone - bare mlx-lm, cold", "ms"
    )
    comparisons["serving_cold_ttft_overhead_ms_1w"] = compare(
        ttft["shoal_1w"], ttft["shoal_engine_alone"], "difference", "shoal_1w - engine alone, cold", "ms"
    )
    for workers in (1, 2):  # reported apart: shoal's prefix cache against bare mlx-lm's prefill again
        side = f"shoal_{workers}w"
        comparisons[f"warm_ttft_overhead_ms_{workers}w"] = compare(
            warm_ttft[side],
            warm_ttft["bare_mlx_lm"],
            "difference",
            f"{side}_warm_ttft_ms (prefix cache) - bare_mlx_lm_warm_ttft_ms (no cache), never judged",
            "ms",
        )
    targets = {
        "decode_ratio_1w": target(
            comparisons["decode_ratio_1w"]["median"], ">=", DECODE_RATIO_MIN, bounded_by=_decode_account(comparisons)
        ),
        "cold_ttft_overhead_ms_1w": target(
            comparisons["cold_ttft_overhead_ms_1w"]["median"],
            "<=",
            TTFT_OVERHEAD_MAX_MS,
            "ms",
            bounded_by=_ttft_account(comparisons),
        ),
    }
    for side, name in ((JSON_SCHEMA_SIDE, "json_schema"), (ADJUSTED_SIDE, "adjusted")):
        side_measures, side_comparisons = _cost_on_1w(cold, side, name)
        measures |= side_measures
        comparisons |= side_comparisons
    tokens = {side: statistics.median(s.tokens for s in cold[side]) for side in SIDES}
    return bench_result(
        "e2e",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        headline=["bare_mlx_lm_cold_ttft_ms", "bare_mlx_lm_decode_tps", *comparisons],
        checks={"every_side_generated_the_same_tokens": len(set(tokens.values())) == 1},
        details={"tokens_per_request": tokens},
    )


def _decode_account(comparisons: dict[str, Any]) -> str:
    """Where a single stream's decode rate goes, from this run's medians: the decode loop, then serving."""
    engine, serving = (
        comparisons[n]["median"] for n in ("engine_alone_decode_ratio", "decode_ratio_1w_over_engine_alone")
    )
    pin, unpinned, shoal_pin = (
        comparisons[n]["median"]
        for n in (
            "bare_pinned_over_unpinned_decode_ratio",
            "decode_ratio_1w_unpinned",
            "unpinned_over_pinned_decode_ratio_1w",
        )
    )
    return (
        f"shoal's engine alone decodes at {_shown(engine)}x bare mlx-lm (the decode loop) and 1 worker at "
        f"{_shown(serving)}x the engine alone (serving: the runner's bridge and events, NATS, the API, HTTP, "
        f"the client); pinning is worth {_shown(pin)}x to bare mlx-lm, which has it too; with neither pinned, "
        f"1 worker decodes at {_shown(unpinned)}x bare mlx-lm ({_shown(shoal_pin)}x its pinned self)"
    )


def _ttft_account(comparisons: dict[str, Any]) -> str:
    """Where a cold request's extra milliseconds before its first token go, from this run's medians."""
    engine = comparisons["engine_alone_cold_ttft_overhead_ms"]["median"]
    serving = comparisons["serving_cold_ttft_overhead_ms_1w"]["median"]
    return (
        f"the engine alone's cold TTFT is {_shown(engine)} ms over bare mlx-lm's (admission and the decode "
        f"loop's prefill) and 1 worker's {_shown(serving)} ms over the engine alone's (the task's events, NATS, "
        "the API, HTTP, the client)"
    )


def _shown(value: float | None) -> str:
    return "no" if value is None else readable(value)


def _cost_on_1w(samples: dict[str, list[Sample]], side: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What `side`'s extra (a json_schema grammar, logit adjustments) costs per token on 1 worker:
    its decode rate, and the difference in milliseconds per token against the same cluster's plain
    request, per round (a round where either side decoded no rate is counted, not dropped silently)."""
    extra = [s.decode_tps for s in samples[side]]
    plain = [s.decode_tps for s in samples["shoal_1w"]]
    per_token = [1000 / c - 1000 / p for c, p in zip(extra, plain, strict=True) if c > 0 and p > 0]
    measures = {
        f"{side}_decode_tps": summarize(extra, "tok/s"),
        f"{name}_cost_ms_per_token_1w": summarize(per_token, "ms")
        | {"rounds": len(extra), "zero_denominators": len(extra) - len(per_token)},
    }
    comparisons = {
        f"{name}_decode_ratio_1w": compare(extra, plain, "ratio", f"{side}_decode_tps / shoal_1w_decode_tps")
    }
    return measures, comparisons
