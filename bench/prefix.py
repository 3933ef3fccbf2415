"""`shoal bench prefix`: the second turn of a conversation with a long shared history, warm vs cold.

Per round, on `shoal up --workers 1` and `--workers 2`: turn 1 sends a history of
`--history-words` words (400: ~2,000 tokens with the tiny model's tokenizer; its own words, so no round reuses another's); turn 2 continues it
(history, the answer, a new question) and is served warm, from the prefix cache; then the same
turn 2 with a history of other words is served cold, as long and with nothing to reuse. Each
request is streamed; TTFT is when its first content chunk arrived. The usage of each turn says
how many prompt tokens came from the cache (`prompt_tokens_details.cached_tokens`), so the run
checks that the warm turns reused their history and the cold ones nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.options import Sized, add_sized, resolve
from bench.result import bench_result
from bench.serve_sides import MODELS, ShoalSide, model_dir
from bench.stats import compare, summarize, target

ABOUT = "TTFT of a conversation's second turn after a ~2,000-token history: prefix cache warm vs cold"
SIZED = (
    Sized("--rounds", 5, 2, "conversations per side"),
    Sized("--history-words", 400, 100, "words of the first turn's history (400: ~2,000 tiny-model tokens)"),
    Sized("--max-tokens", 16, 8, "tokens each turn generates"),
    Sized("--model", "tiny", "tiny", f"one of: {', '.join(MODELS)}", str),
    Sized("--workers", "1,2", "1,2", "comma-separated worker counts (one cluster each)", str),
)
TARGET_WARM_OVER_COLD = 0.15
WORDS = ("river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "thunder", "orchard", "glacier")


@dataclass(frozen=True, slots=True)
class Turn:
    ttft_ms: float
    text: str
    prompt_tokens: int
    cached_tokens: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_sized(parser, SIZED)
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds each cluster may take to start")


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = resolve(args, SIZED)
    workers = [int(w) for w in str(settings["workers"]).split(",") if w.strip()]
    sides: dict[str, dict[str, list[Turn]]] = {}
    with tempfile.TemporaryDirectory(prefix="shoal-bench-prefix-") as root:
        directory = model_dir(str(settings["model"]), Path(root) / "data")
        for count in workers:
            with contextlib.ExitStack() as stack:
                side = ShoalSide(directory, Path(root), count, max_queued_tasks=64)
                stack.callback(side.stop)
                side.cluster.wait_ready(args.ready_timeout)
                sides[side.name] = asyncio.run(_rounds(side.base_url, str(directory), settings))
    return _report(settings, sides, quick=bool(args.quick))


def history(seed: str, words: int) -> str:
    """Words of their own per seed: no two seeds share more than their first characters."""
    rng = random.Random(seed)
    return f"[{seed}] " + " ".join(rng.choice(WORDS) for _ in range(words))


async def _rounds(base_url: str, model: str, settings: dict[str, Any]) -> dict[str, list[Turn]]:
    size, max_tokens = int(settings["history_words"]), int(settings["max_tokens"])
    turns: dict[str, list[Turn]] = {"first": [], "warm": [], "cold": []}
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0)) as client:
        await _ask(client, model, [{"role": "user", "content": "warm-up"}], max_tokens)
        for index in range(int(settings["rounds"])):
            asked = [{"role": "user", "content": history(f"round {index}", size)}]
            first = await _ask(client, model, asked, max_tokens)
            follow_up = [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then?"}]
            warm = await _ask(client, model, asked + follow_up, max_tokens)
            other = [{"role": "user", "content": history(f"cold {index}", size)}]
            cold = await _ask(client, model, other + follow_up, max_tokens)
            for name, turn in (("first", first), ("warm", warm), ("cold", cold)):
                turns[name].append(turn)
    return turns


async def _ask(client: httpx.AsyncClient, model: str, messages: list[dict[str, str]], max_tokens: int) -> Turn:
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    ttft, text, usage = None, [], {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line.removeprefix("data: "))
            usage = data.get("usage") or usage
            for choice in data.get("choices", ()):
                if content := (choice.get("delta") or {}).get("content"):
                    ttft = ttft if ttft is not None else (time.perf_counter() - sent) * 1000
                    text.append(content)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return Turn(ttft or 0.0, "".join(text), int(usage.get("prompt_tokens") or 0), cached)


def _report(settings: dict[str, Any], sides: dict[str, dict[str, list[Turn]]], quick: bool) -> dict[str, Any]:
    measures: dict[str, Any] = {}
    comparisons: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    checks: dict[str, bool] = {}
    for name, turns in sides.items():
        for kind in ("warm", "cold"):
            measures[f"{name}_ttft_{kind}_ms"] = summarize([t.ttft_ms for t in turns[kind]], "ms")
        warm, cold = ([t.ttft_ms for t in turns[kind]] for kind in ("warm", "cold"))
        comparisons[f"{name}_warm_over_cold"] = compare(warm, cold, "ratio", f"{name}: warm / cold TTFT")
        targets[f"{name}_warm_over_cold"] = target(
            comparisons[f"{name}_warm_over_cold"]["median"], "<=", TARGET_WARM_OVER_COLD
        )
        checks[f"{name}_warm_turns_reused_the_history"] = all(
            t.cached_tokens >= f.prompt_tokens - 1 for t, f in zip(turns["warm"], turns["first"], strict=True)
        )
        checks[f"{name}_cold_turns_reused_nothing"] = all(t.cached_tokens < 16 for t in turns["cold"])
    details = {
        name: {
            kind: [
                {"ttft_ms": round(t.ttft_ms, 2), "prompt_tokens": t.prompt_tokens, "cached": t.cached_tokens}
                for t in ts
            ]
            for kind, ts in turns.items()
        }
        for name, turns in sides.items()
    }
    figures = {"measures": measures, "comparisons": comparisons, "targets": targets, "checks": checks}
    return bench_result(
        "prefix",
        about=ABOUT,
        quick=quick,
        settings=settings,
        headline=list(comparisons),
        details={"turns": details},
        **figures,
    )
