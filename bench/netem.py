"""`shoal bench netem`: what a slow, lossy wire between hosts costs (issue 9 item 6).

A cluster across network namespaces (`bench/netcluster.py`: three NATS servers, the control
host, two worker hosts whose ranks talk over veth links), then rounds of one request on clean
links and one with `--qdisc` (default `netem delay 20ms loss 1%`) on both worker hosts' links,
the order rotating per round. Reported: time to first token (client side) and decode tokens/s
(the log's completion tokens over the client's first-to-last-token time), and their ratios
shaped / clean per round. Needs root and network namespaces; netem needs CONFIG_NET_SCH_NETEM
(where the kernel lacks it, give another qdisc, e.g. `--qdisc "tbf rate 20mbit burst 32kbit latency 50ms"`).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import tempfile
from pathlib import Path
from typing import Any

from bench.cluster import long_prompt
from bench.hosts import unavailable_reason
from bench.netclient import ClientCall, stream_chat
from bench.netcluster import NetCluster
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.rounds import run_rounds
from bench.stats import compare, summarize
from eventlog.log import EventLog
from events.catalogue import TaskCompleted

ABOUT = "TTFT and decode tokens/s of 2 ranks on separate namespaced hosts, clean links vs a shaped wire (tc)"
SIZED = (
    Sized("--rounds", 5, 1, "rounds; each runs one request on clean links and one on shaped links"),
    Sized("--max-tokens", 64, 16, "tokens generated per request"),
)
BOUND_SECONDS = 120.0  # a request that takes longer is a hang: the bench fails rather than waits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--qdisc", default="netem delay 20ms loss 1%", help="the qdisc put on the worker links")
    parser.add_argument("--prompt-words", type=int, default=60, help="prompt length in words (~5 tokens each)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"shoal bench netem: {reason}")
    settings = resolve(args, SIZED) | {"qdisc": args.qdisc, "prompt_words": args.prompt_words}
    prompt = long_prompt(args.prompt_words)
    with tempfile.TemporaryDirectory(prefix="shoal-bench-netem-") as root:
        cluster = NetCluster(Path(root))
        try:
            cluster.wait_ready(300)
            _request(cluster, prompt, 4)  # the first request loads the API's tokenizer: not measured
            sides = {
                "clean": lambda: _request(cluster, prompt, settings["max_tokens"]),
                "shaped": lambda: _shaped(cluster, args.qdisc, prompt, settings["max_tokens"]),
            }
            calls = run_rounds(sides, settings["rounds"])
            tokens = asyncio.run(_completion_tokens(cluster))
        finally:
            cluster.stop()
    return _report(settings, calls, tokens, quick=bool(args.quick))


def _request(cluster: NetCluster, prompt: str, max_tokens: int) -> ClientCall:
    with cluster.http() as http:
        call = stream_chat(http, prompt, max_tokens, bound_seconds=BOUND_SECONDS)
    if call.outcome != "completed":
        raise SystemExit(f"shoal bench netem: a request ended {call.outcome}: {call.error}\n{cluster.tails()}")
    return call


def _shaped(cluster: NetCluster, qdisc: str, prompt: str, max_tokens: int) -> ClientCall:
    workers = [worker.name for worker in cluster.workers]
    try:
        for name in workers:
            cluster.net.shape(name, *shlex.split(qdisc))
        return _request(cluster, prompt, max_tokens)
    finally:
        for name in workers:
            cluster.net.unshape(name)


async def _completion_tokens(cluster: NetCluster) -> dict[str, int]:
    log = await EventLog.connect(cluster.admin_endpoint(), ensure=False)
    try:
        return {e.task_id: e.usage.completion_tokens async for _, e in log.replay() if isinstance(e, TaskCompleted)}
    finally:
        await log.close()


def _decode_rate(call: ClientCall, tokens: dict[str, int]) -> float:
    first, last = call.first_text_seconds or 0.0, call.last_text_seconds or 0.0
    count = tokens.get(call.task_id, 0)
    return (count - 1) / (last - first) if count > 1 and last > first else 0.0


def _report(
    settings: dict[str, Any], calls: dict[str, list[ClientCall]], tokens: dict[str, int], *, quick: bool
) -> dict[str, Any]:
    ttft = {side: [(c.first_text_seconds or 0.0) * 1000 for c in sides] for side, sides in calls.items()}
    rate = {side: [_decode_rate(c, tokens) for c in sides] for side, sides in calls.items()}
    return bench_result(
        "netem",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures={
            "ttft_clean": summarize(ttft["clean"], "ms"),
            "ttft_shaped": summarize(ttft["shaped"], "ms"),
            "decode_clean": summarize(rate["clean"], "tok/s"),
            "decode_shaped": summarize(rate["shaped"], "tok/s"),
        },
        comparisons={
            "ttft_ratio": compare(ttft["shaped"], ttft["clean"], "ratio", of="shaped / clean"),
            "decode_ratio": compare(rate["shaped"], rate["clean"], "ratio", of="shaped / clean"),
        },
        targets={},
        headline=["ttft_ratio", "decode_ratio"],
        checks={
            "every request completed": True,
            "every decode rate measured": all(v > 0 for r in rate.values() for v in r),
        },
    )
