"""`shoal bench cancel`: how fast a cancel stops every rank, in prefill and in decode.

`shoal up --workers 2`, then rounds of two requests, each cancelled with
`POST /v1/tasks/{id}/cancel` (the order rotates per round): a long prompt cancelled after a
random number of prefill chunks, and a short prompt with many tokens cancelled after a random
number of streamed tokens. Then, from the log (`bench.cancel_outcomes`): where each cancel
really landed, the time from `TaskCancelled` to every rank letting the task go (its batch's
streams leave at the step that agreed the cancel: the task's cancelled end; a runner serving one
task at a time: every rank idle), and hangs (a task not let go within `--idle-deadline`). The
measures keep their names (`..._cancel_to_idle_ms`). Latencies are reported per landing phase,
with a p99 that says when it is only the maximum (fewer than 100 samples).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import httpx

from bench.cancel_outcomes import Outcome, cadence, outcomes, pending
from bench.cluster import Cluster, long_prompt
from bench.options import Sized, add_sized, resolve
from bench.result import bench_result, readable
from bench.rounds import run_rounds
from bench.stats import summarize, tail, target
from eventlog.log import EventLog
from events.catalogue import LogEvent

ABOUT = (
    "`POST /v1/tasks/{id}/cancel` on 2 ranks, alternately after 1-8 prefill chunks of a long prompt and after "
    "1-32 streamed tokens; `TaskCancelled` to every rank letting the task go (a batch: its cancelled end), "
    "from the log, by where the cancel landed"
)
SIZED = (Sized("--rounds", 120, 2, "rounds; each cancels one request in prefill and one in decode"),)
WORLD = 2
DECODE_PROMPT = "Write a long story about a river, a stone and a lantern."
PREFILL_MAX_TOKENS = 4  # a prefill cancel that comes too late ends the task at once: a miss, not a decode cancel
DECODE_MAX_TOKENS = 1024
PREFILL_CANCEL_CHUNKS = (1, 8)  # cancel after this many prefill progress chunks (inclusive range)
DECODE_CANCEL_CHUNKS = (1, 32)  # ... or after this many streamed token chunks
Counted = Literal["prompt_progress", "content"]  # which streamed chunks a cancel waits for
SLACK_MS = 50.0  # a cancel may take one chunk (prefill) or one decode step (decode), plus this


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument(
        "--prompt-words", type=int, default=400, help="prefill-cancel prompt length in words (~5 tokens each)"
    )
    parser.add_argument("--prefill-step", type=int, default=256)
    parser.add_argument("--idle-deadline", type=float, default=10.0, help="seconds after which a cancel is a hang")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED) | {
        "prompt_words": args.prompt_words,
        "prefill_step": args.prefill_step,
        "idle_deadline_s": args.idle_deadline,
        "seed": args.seed,
        "ranks": WORLD,
    }
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="shoal-bench-cancel-") as root:
        cluster = Cluster(
            Path(root),
            workers=WORLD,
            prefill_step_size=str(args.prefill_step),
            log_level="WARNING",
        )
        try:
            cluster.wait_ready(timeout=300)
            prompt = long_prompt(settings["prompt_words"])
            sides: dict[str, Callable[[], str]] = {
                "prefill": lambda: _cancel_once(
                    cluster, prompt, PREFILL_MAX_TOKENS, "prompt_progress", rng, PREFILL_CANCEL_CHUNKS
                ),
                "decode": lambda: _cancel_once(
                    cluster, DECODE_PROMPT, DECODE_MAX_TOKENS, "content", rng, DECODE_CANCEL_CHUNKS
                ),
            }
            tasks = run_rounds(sides, settings["rounds"])
            events = asyncio.run(_settled_log(cluster, [*tasks["prefill"], *tasks["decode"]], args))
        finally:
            cluster.stop()
    return _report(settings, tasks, events, quick=bool(args.quick))


def _cancel_once(
    cluster: Cluster, prompt: str, max_tokens: int, counted: Counted, rng: random.Random, after: tuple[int, int]
) -> str:
    """Stream a request; cancel it after a random number of `counted` chunks; read to the end."""
    cancel_after = rng.randint(*after)
    seen = 0
    with (
        cluster.client(timeout=120).chat.completions.with_streaming_response.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            extra_body={"shoal_progress": True},
        ) as response,
        httpx.Client(base_url=cluster.base_url, timeout=30) as http,
    ):
        task_id = response.headers["x-shoal-task-id"]
        for chunk in response.parse():
            if _counts(chunk, counted):
                seen += 1
                if seen == cancel_after:
                    http.post(f"/v1/tasks/{task_id}/cancel")
    return task_id


def _counts(chunk: Any, counted: Counted) -> bool:
    if counted == "prompt_progress":
        progress = (chunk.model_extra or {}).get("prompt_progress")
        return bool(progress) and progress["processed"] > 0
    return bool(chunk.choices) and bool(chunk.choices[0].delta.content)


async def _settled_log(cluster: Cluster, task_ids: list[str], args: argparse.Namespace) -> list[LogEvent]:
    """The log once every cancelled task has all ranks idle, or the idle deadline has passed."""
    log = await EventLog.connect(cluster.admin_endpoint(), name="shoal-bench-cancel")
    try:
        give_up = time.monotonic() + args.idle_deadline
        while True:
            events = [event async for _seq, event in log.replay()]
            if not pending(events, task_ids, WORLD) or time.monotonic() > give_up:
                return events
            await asyncio.sleep(0.25)
    finally:
        await log.close()


def _report(
    settings: dict[str, Any], tasks: dict[str, list[str]], events: list[LogEvent], quick: bool
) -> dict[str, Any]:
    deadline_ms = settings["idle_deadline_s"] * 1000
    results = outcomes(events, [*tasks["prefill"], *tasks["decode"]], WORLD, deadline_ms)
    steps = cadence(events, rank=WORLD - 1)
    measures = {
        "prefill_cancel_to_idle_ms": _with_tail(_latencies(results, "prefill")),
        "decode_cancel_to_idle_ms": _with_tail(_latencies(results, "decode")),
        "prefill_chunk_ms": summarize(steps.prefill_chunk_ms, "ms"),
        "decode_token_ms": summarize(steps.decode_token_ms, "ms"),
    }
    chunk_ms = measures["prefill_chunk_ms"]["median"] or 0.0
    poll_ms = measures["decode_token_ms"]["median"] or 0.0  # the batch polls the cancel every step
    hangs = [o.task_id for o in results if o.landed == "hang"]
    targets = {
        "prefill_p99_ms": target(
            measures["prefill_cancel_to_idle_ms"]["p99"], "<=", round(chunk_ms + SLACK_MS, 1), "ms"
        ),
        "decode_p99_ms": target(measures["decode_cancel_to_idle_ms"]["p99"], "<=", round(poll_ms + SLACK_MS, 1), "ms"),
        "hangs": target(len(hangs), "==", 0),
    }
    landed = {kind: sum(1 for o in results if o.landed == kind) for kind in ("prefill", "decode", "missed", "hang")}
    return bench_result(
        "cancel",
        about=ABOUT,
        quick=quick,
        settings=settings,
        measures=measures,
        comparisons={},
        targets=targets,
        headline=list(measures),
        notes=[
            f"the targets: prefill p99 <= one chunk ({readable(chunk_ms)} ms) + {SLACK_MS:g} ms; decode p99 <= one "
            f"decode step ({readable(poll_ms)} ms: the batch polls the cancel every step) + {SLACK_MS:g} ms; zero hangs"
        ],
        details={
            "requested": {kind: len(ids) for kind, ids in tasks.items()},
            "cancelled_in_prefill": landed["prefill"],
            "cancelled_in_decode": landed["decode"],
            "missed": landed["missed"],
            "hangs": landed["hang"],
            "hung_tasks": hangs,
        },
    )


def _latencies(results: list[Outcome], landed: str) -> list[float]:
    return [o.latency_ms for o in results if o.landed == landed and o.latency_ms is not None]


def _with_tail(values: list[float]) -> dict[str, Any]:
    p99 = tail(values, 0.99)
    return summarize(values, "ms") | {"p99": p99["value"], "p99_is_max": p99["is_max"]}
