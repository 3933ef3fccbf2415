"""`shoal bench fair`: one client's flood beside another client's single request.

Per round and side: a heavy client sends `--flood` streamed requests (4 batches' worth: each server
batches `--batch` sequences), 10 ms apart; once the first streams and the last are in, a light
client sends one request. Its time to first token is what the flood costs it, told in stream
lengths (the time one of the flood's streams takes to decode once started). Three sides, each
leading a round in turn:
- `mlx_lm_server` (the anchor, `--decode-concurrency` = the batch): arrival order, so the light
  request waits for the batches of the flood ahead of it;
- `shoal_1w_own_key`: `shoal up --workers 1` (`max_batch` = the batch), the light client on a key
  of its own: each place that frees goes to the key holding the fewest
  (`services/master/fair_share.py`), so it waits about one stream's length;
- `shoal_1w_flood_key`: the same cluster, the light client on the flood's key: one key is served in
  the log's order, as every request was before the fair share.
The light request alone on the idle server and the flood's aggregate tokens/s (what fairness must
not cost) are measured too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.serve_load import Served, stream_chat
from bench.serve_sides import MODELS, AnchorServer, ShoalSide, model_dir
from bench.stats import compare, summarize, target

ABOUT = (
    "a heavy client's flood (4 batches' worth of streams) and a light client's one request after it: the light "
    "request's TTFT in stream lengths, mlx_lm.server (arrival order) vs shoal up --workers 1 with the light client "
    "on a key of its own (fair share) and on the flood's key (log order)"
)
SIZED = (
    Sized("--rounds", 4, 1, "rounds per side"),
    Sized("--batch", 8, 4, "sequences each server decodes at once (mlx_lm.server --decode-concurrency, max_batch)"),
    Sized("--flood", 32, 12, "streams the heavy client sends at once"),
    Sized("--max-tokens", 48, 24, "tokens each request generates"),
    Sized("--model", "tiny", "tiny", f"one of: {', '.join(MODELS)}", str),
)
TARGET_LIGHT_WAIT_IN_STREAMS = 1.5  # the light request waits at most about one stream's length
CONNECT_ATTEMPTS = 20
FLOOD_STAGGER_SECONDS = 0.01
FLOOD_SETTLE_SECONDS = 0.2
SIDES = ("mlx_lm_server", "shoal_1w_own_key", "shoal_1w_flood_key")
HEAVY_KEY = "heavy-0123456789abcdef0123"
LIGHT_KEY = "light-0123456789abcdef0123"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds each server may take to start")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED)
    batch, max_tokens = int(settings["batch"]), int(settings["max_tokens"])
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in SIDES}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-fair-") as root, contextlib.ExitStack() as stack:
        directory = model_dir(str(settings["model"]), Path(root) / "data")
        anchor = AnchorServer(directory, Path(root), max_tokens, decode_concurrency=batch)
        stack.callback(anchor.stop)
        queue = int(settings["flood"]) + 8  # every request of a round, of either key: the order served is timed
        shoal = ShoalSide(
            directory,
            Path(root),
            1,
            max_queued_tasks=queue,
            max_queued_tasks_per_key=str(queue),
            max_batch=str(batch),
            api_keys=f"{HEAVY_KEY},{LIGHT_KEY}",
        )
        stack.callback(shoal.stop)
        anchor.wait_ready(args.ready_timeout)
        shoal.cluster.wait_ready(args.ready_timeout)
        urls = {
            "mlx_lm_server": anchor.base_url,
            "shoal_1w_own_key": shoal.base_url,
            "shoal_1w_flood_key": shoal.base_url,
        }
        for index in range(int(settings["rounds"])):
            order = SIDES[index % len(SIDES) :] + SIDES[: index % len(SIDES)]  # each side leads in turn
            for name in order:
                light_key = HEAVY_KEY if name == "shoal_1w_flood_key" else LIGHT_KEY
                rounds[name].append(asyncio.run(_round(urls[name], light_key, str(directory), settings, index)))
    return _report(settings, rounds, quick=bool(args.quick))


async def _round(base_url: str, light_key: str, model: str, settings: dict[str, Any], index: int) -> dict[str, float]:
    flood, max_tokens = int(settings["flood"]), int(settings["max_tokens"])
    limits = httpx.Limits(max_connections=flood + 8, max_keepalive_connections=flood + 8)

    def client(key: str) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"}
        return httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0), limits=limits, headers=headers)

    async with client(HEAVY_KEY) as heavy, client(light_key) as light:
        alone = await _retried(light, model, max_tokens, f"[round {index} alone] Tell me about the river.")
        started = time.perf_counter()
        streaming = asyncio.Event()  # the server is busy with the flood
        floods: list[asyncio.Task[Served]] = []
        for n in range(flood):  # a few ms apart: mlx_lm.server's listening socket queues 5 connections
            prompt = f"[round {index} flood {n}] A story."
            floods.append(asyncio.create_task(_retried(heavy, model, max_tokens, prompt, streaming)))
            await asyncio.sleep(FLOOD_STAGGER_SECONDS)
        await asyncio.wait_for(streaming.wait(), 300)
        await asyncio.sleep(FLOOD_SETTLE_SECONDS)  # the last ones are read and queued by the server
        light_one = await _retried(light, model, max_tokens, f"[round {index} light] Tell me about the stone.")
        heavy_served = await asyncio.gather(*floods)
        wall = time.perf_counter() - started
    for served in (alone, light_one, *heavy_served):
        if served.status != 200 or served.error or served.ttft_ms is None:
            raise RuntimeError(f"a request failed: HTTP {served.status} {served.error}")
    stream_ms = statistics.median(sum(s.gaps_ms) for s in heavy_served)
    return {
        "light_ttft_ms": light_one.ttft_ms or 0.0,
        "light_alone_ttft_ms": alone.ttft_ms or 0.0,
        "stream_ms": stream_ms,
        "flood_tps": sum(s.tokens for s in heavy_served) / wall,
        "light_ahead_of": float(sum(1 for s in heavy_served if _ended(s) > _ended(light_one))),
        "flood_retries": float(sum(s.retries for s in heavy_served)),
    }


async def _retried(
    client: httpx.AsyncClient, model: str, max_tokens: int, prompt: str, first_token: asyncio.Event | None = None
) -> Served:
    """A request, sent again (as a client would) while its connection is refused or reset before
    any answer: mlx_lm.server's listening socket queues 5 connections (`http.server`), so part of a
    burst can be reset; the retries are counted."""
    served = await stream_chat(client, model, max_tokens, prompt, first_token)
    while served.status == 0 and not served.hung and served.retries < CONNECT_ATTEMPTS:
        await asyncio.sleep(0.05 * (served.retries + 1))
        retries = served.retries + 1
        served = await stream_chat(client, model, max_tokens, prompt, first_token)
        served.retries = retries
    return served


def _ended(served: Served) -> float:
    return served.sent_at + ((served.ttft_ms or 0.0) + sum(served.gaps_ms)) / 1000


def _report(settings: dict[str, Any], rounds: dict[str, list[dict[str, float]]], quick: bool) -> dict[str, Any]:
    measures: dict[str, Any] = {}
    comparisons: dict[str, Any] = {}
    for name, figures in rounds.items():
        for key, unit in (
            ("light_ttft_ms", "ms"),
            ("light_alone_ttft_ms", "ms"),
            ("stream_ms", "ms"),
            ("flood_tps", "tok/s"),
            ("light_ahead_of", "streams"),
            ("flood_retries", "requests"),
        ):
            measures[f"{name}_{key}"] = summarize([f[key] for f in figures], unit)
        waits = [f["light_ttft_ms"] for f in figures]
        comparisons[f"{name}_light_wait_in_streams"] = compare(
            waits, [f["stream_ms"] for f in figures], "ratio", f"{name}: the light request's TTFT / one stream's length"
        )
    fair, anchor = rounds["shoal_1w_own_key"], rounds["mlx_lm_server"]
    comparisons["own_key_over_flood_key_light_ttft"] = compare(
        [f["light_ttft_ms"] for f in fair],
        [f["light_ttft_ms"] for f in rounds["shoal_1w_flood_key"]],
        "ratio",
        "shoal: the light request's TTFT on a key of its own / on the flood's key (the log's order)",
    )
    comparisons["shoal_over_mlx_lm_light_ttft"] = compare(
        [f["light_ttft_ms"] for f in fair],
        [f["light_ttft_ms"] for f in anchor],
        "ratio",
        "the light request's TTFT under the flood: shoal (a key of its own) / mlx_lm.server",
    )
    comparisons["shoal_over_mlx_lm_flood_tps"] = compare(
        [f["flood_tps"] for f in fair],
        [f["flood_tps"] for f in anchor],
        "ratio",
        "the flood's aggregate tokens/s: shoal / mlx_lm.server",
    )
    targets = {
        "shoal_1w_own_key_light_wait_in_streams": target(
            comparisons["shoal_1w_own_key_light_wait_in_streams"]["median"], "<=", TARGET_LIGHT_WAIT_IN_STREAMS
        )
    }
    return bench_result(
        "fair",
        about=ABOUT,
        quick=quick,
        settings=settings,
        headline=list(comparisons),
        measures=measures,
        comparisons=comparisons,
        targets=targets,
        details={"rounds": rounds},
    )
