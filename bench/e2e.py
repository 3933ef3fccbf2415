"""`shoal bench e2e`: time to first token and decode rate, bare mlx-lm vs through shoal, interleaved.

Three sides stay up for the whole run: bare mlx-lm `stream_generate` (a subprocess with a
1-rank runner's BLAS environment, `bench.bare_mlx`), `shoal up --workers 1` and
`shoal up --workers 2`, both reached with the official openai client. After a warm-up, each
round sends one request to every side (the order rotates per round), so a neighbour's load
lands on all three; the ratios and differences are taken per round and their medians judged.
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
from bench.result import bench_result
from bench.rounds import run_rounds
from bench.stats import compare, summarize, target

PROMPT = "Write a long story about a river, a stone and a lantern."
ABOUT = (
    "streamed chat requests after warm-up, interleaved per round: bare mlx-lm `stream_generate` vs "
    "`shoal up --workers 1` and `--workers 2` through the openai client (tiny model); 1 worker with "
    "logprobs (top_logprobs=5); and 1 worker under a json_schema constraint and with logit_bias and "
    "penalties, for the per-token cost of constrained decoding and of logit adjustments; and bare mlx "
    "on a 2-rank ring (the model's halves, one hop each way per token), what a 2-rank pipeline costs "
    "before shoal adds anything; and shoal's engine alone (a 1-rank runner's decode loop in one process, "
    "no services), which splits the 1-worker side's cost into the decode loop's and serving's"
)
SIZED = (
    Sized("--rounds", 20, 2, "rounds; each sends one request to every side"),
    Sized("--max-tokens", 64, 16, "tokens to generate per request"),
    Sized("--warmup", 2, 1, "unmeasured requests per side before the rounds"),
)
SIDES = ("bare_mlx_lm", "bare_mlx_pipeline_2r", "shoal_engine_alone", "shoal_1w", "shoal_2w", "shoal_1w_logprobs")
# (comparison, side, the side it is read against): decode rate ratios per round.
DECODE_RATIOS = (
    ("decode_ratio_2w_over_bare_pipeline", "shoal_2w", "bare_mlx_pipeline_2r"),
    ("bare_pipeline_decode_ratio", "bare_mlx_pipeline_2r", "bare_mlx_lm"),
    ("engine_alone_decode_ratio", "shoal_engine_alone", "bare_mlx_lm"),
    ("decode_ratio_1w_over_engine_alone", "shoal_1w", "shoal_engine_alone"),
    ("logprobs_decode_ratio_1w", "shoal_1w_logprobs", "shoal_1w"),
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
DECODE_RATIO_MIN = 0.95
TTFT_OVERHEAD_MAX_MS = 15.0


class Sample(NamedTuple):
    ttft_ms: float
    decode_tps: float
    tokens: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--prefill-step", type=int, default=256)


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED) | {"prefill_step": args.prefill_step, "prompt": PROMPT}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-e2e-") as root, contextlib.ExitStack() as stack:
        env = {**os.environ, "SHOAL_DATA_DIR": str(Path(root) / "data")}
        model_dir = _tiny_dir(env)
        clusters = [_cluster(Path(root), workers, args.prefill_step) for workers in (1, 2)]
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
        sides: dict[str, Callable[[], Sample]] = {
            "bare_mlx_lm": lambda: Sample(**bare.generate()),
            "bare_mlx_pipeline_2r": lambda: Sample(**pipeline.generate()),
            "shoal_engine_alone": lambda: Sample(**engine.generate()),
        }
        for workers, cluster in zip((1, 2), clusters, strict=True):
            sides[f"shoal_{workers}w"] = partial(_one_request, cluster.client(timeout=120), settings["max_tokens"])
        sides["shoal_1w_logprobs"] = partial(
            _one_request, clusters[0].client(timeout=120), settings["max_tokens"], **LOGPROBS
        )
        sides[JSON_SCHEMA_SIDE] = _json_schema_side(clusters[0], settings["max_tokens"])
        sides[ADJUSTED_SIDE] = partial(
            _one_request, clusters[0].client(timeout=120), settings["max_tokens"], **ADJUSTMENTS
        )
        for side in sides.values():
            for _ in range(settings["warmup"]):
                side()
        samples = run_rounds(sides, settings["rounds"])
    return _report(settings, samples, quick=bool(args.quick))


def _cluster(root: Path, workers: int, prefill_step: int) -> Cluster:
    home = root / f"w{workers}"
    home.mkdir(parents=True)
    return Cluster(home, workers=workers, prefill_step_size=str(prefill_step), log_level="WARNING")


def _tiny_dir(env: dict[str, str]) -> str:
    code = "from runner.models.tiny import cached_tiny; print(cached_tiny())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _json_schema_side(cluster: Cluster, max_tokens: int) -> Callable[[], Sample]:
    """The 1-worker side again, its output held to a JSON schema by the sampling rank's grammar."""
    return partial(_one_request, cluster.client(timeout=120), max_tokens, response_format=STORY_FORMAT)


def _one_request(client: Any, max_tokens: int, **extra: Any) -> Sample:
    started = time.perf_counter()
    first = last = started
    count = 0
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
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


def _report(settings: dict[str, Any], samples: dict[str, list[Sample]], quick: bool) -> dict[str, Any]:
    ttft = {side: [s.ttft_ms for s in samples[side]] for side in SIDES}
    decode = {side: [s.decode_tps for s in samples[side]] for side in SIDES}
    measures: dict[str, Any] = {}
    for side in SIDES:
        measures[f"{side}_ttft_ms"] = summarize(ttft[side], "ms")
        measures[f"{side}_decode_tps"] = summarize(decode[side], "tok/s")
    comparisons: dict[str, Any] = {}
    for workers in (1, 2):
        side = f"shoal_{workers}w"
        comparisons[f"decode_ratio_{workers}w"] = compare(
            decode[side], decode["bare_mlx_lm"], "ratio", f"{side}_decode_tps / bare_mlx_lm_decode_tps"
        )
        comparisons[f"ttft_overhead_ms_{workers}w"] = compare(
            ttft[side], ttft["bare_mlx_lm"], "difference", f"{side}_ttft_ms - bare_mlx_lm_ttft_ms", "ms"
        )
    for name, side, over in DECODE_RATIOS:
        comparisons[name] = compare(decode[side], decode[over], "ratio", f"{side}_decode_tps / {over}_decode_tps")
    targets = {
        "decode_ratio_1w": target(comparisons["decode_ratio_1w"]["median"], ">=", DECODE_RATIO_MIN),
        "ttft_overhead_ms_1w": target(comparisons["ttft_overhead_ms_1w"]["median"], "<=", TTFT_OVERHEAD_MAX_MS, "ms"),
    }
    for side, name in ((JSON_SCHEMA_SIDE, "json_schema"), (ADJUSTED_SIDE, "adjusted")):
        side_measures, side_comparisons = _cost_on_1w(samples, side, name)
        measures |= side_measures
        comparisons |= side_comparisons
    tokens = {side: statistics.median(s.tokens for s in samples[side]) for side in SIDES}
    return bench_result(
        "e2e",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        headline=["bare_mlx_lm_ttft_ms", "bare_mlx_lm_decode_tps", *comparisons],
        checks={"every_side_generated_the_same_tokens": len(set(tokens.values())) == 1},
        details={"tokens_per_request": tokens},
    )


def _cost_on_1w(samples: dict[str, list[Sample]], side: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What `side`'s extra (a json_schema grammar, logit adjustments) costs per token on 1 worker:
    its decode rate, and the difference in milliseconds per token against the same cluster's plain
    request, per round."""
    extra = [s.decode_tps for s in samples[side]]
    plain = [s.decode_tps for s in samples["shoal_1w"]]
    per_token = [1000 / c - 1000 / p for c, p in zip(extra, plain, strict=True) if c > 0 and p > 0]
    measures = {
        f"{side}_decode_tps": summarize(extra, "tok/s"),
        f"{name}_cost_ms_per_token_1w": summarize(per_token, "ms"),
    }
    comparisons = {
        f"{name}_decode_ratio_1w": compare(extra, plain, "ratio", f"{side}_decode_tps / shoal_1w_decode_tps")
    }
    return measures, comparisons
