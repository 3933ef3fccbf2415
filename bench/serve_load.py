"""The load of `shoal bench serve`: `concurrency` clients, each streaming chat requests one after
another, against any OpenAI-compatible server; what each request saw, and the level's summary.

Each request is read as server-sent events with httpx, so the times are when bytes arrived, not
when a client library chose to yield them. A token's arrival is a content chunk's; a chunk that
carries several tokens (coalesced) counts as one gap, as a client sees it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.stats import percentile, rounded

PROMPT = "Write a long story about a river, a stone and a lantern."
CONNECT_ATTEMPTS = 20


@dataclass(slots=True)
class Served:
    """One request: its status, when its first token came (ms after sending), the gaps between
    its content chunks (ms), the tokens it got, and an error if it failed."""

    status: int = 0
    sent_at: float = 0.0  # perf_counter when it was sent
    ttft_ms: float | None = None
    gaps_ms: list[float] = field(default_factory=list[float])
    tokens: int = 0
    error: str = ""
    retries: int = 0  # sent again after its connection was refused or reset before any answer
    hung: bool = False  # no byte for the stall timeout: a hang, told apart from an error and never retried
    retry_after: str | None = None  # a refusal's Retry-After header: a 429 with one is an answer

    @property
    def refused(self) -> bool:
        """Refused with a time to come back (429 + Retry-After): an answer, not an error."""
        return self.status == 429 and self.retry_after is not None

    @property
    def failed(self) -> bool:
        """An error: neither served (200 without an error chunk) nor refused, nor a hang (counted apart)."""
        return not self.hung and not self.refused and (self.status != 200 or bool(self.error))


def _percentile(values: list[float], q: float) -> float | None:
    return rounded(percentile(values, q)) if values else None


async def stream_chat(
    client: httpx.AsyncClient,
    model: str,
    max_tokens: int,
    prompt: str = PROMPT,
    first_token: asyncio.Event | None = None,
) -> Served:
    """One streamed chat request, greedy; what it saw (errors are caught and told in `error`).
    `first_token` is set when its first token arrives."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    served = Served(sent_at=sent)
    last: float | None = None
    chunks = 0
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            served.status = response.status_code
            if response.status_code != 200:
                served.retry_after = response.headers.get("retry-after")
                served.error = (await response.aread()).decode(errors="replace")[:200]
                return served
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line.removeprefix("data: "))
                if "error" in data:
                    served.error = str(data["error"].get("message", data["error"]))[:200]
                    continue
                if data.get("usage"):
                    served.tokens = int(data["usage"].get("completion_tokens") or 0)
                content = [c for c in data.get("choices", ()) if (c.get("delta") or {}).get("content")]
                if not content:
                    continue
                now = time.perf_counter()
                chunks += 1
                if last is None:
                    served.ttft_ms = (now - sent) * 1000
                    if first_token is not None:
                        first_token.set()
                else:
                    served.gaps_ms.append((now - last) * 1000)
                last = now
    except httpx.TimeoutException as exc:
        served.hung = True
        served.error = f"hang: {type(exc).__name__} (no byte within the stall timeout)"
    except httpx.HTTPError as exc:
        served.error = f"{type(exc).__name__}: {exc}"
    served.tokens = served.tokens or chunks
    return served


def stalls_after(seconds: float) -> httpx.Timeout:
    """A client's timeouts: a request hangs when no byte comes for `seconds` (its connection, its
    first byte, or the next one); a long stream that keeps sending never does."""
    return httpx.Timeout(seconds, pool=None)


async def run_level(
    base_url: str, model: str, concurrency: int, requests_each: int, max_tokens: int, stall_s: float = 600.0
) -> list[Served]:
    """`concurrency` clients at once, each sending `requests_each` requests in turn, each sent
    again while its connection is refused or reset before any answer (`stream_chat_retried`):
    every side alike, so a server's listen backlog costs it retries, never requests."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=stalls_after(stall_s), limits=limits) as client:

        async def one_client() -> list[Served]:
            return [await stream_chat_retried(client, model, max_tokens) for _ in range(requests_each)]

        per_client = await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return [served for done in per_client for served in done]


def summarize_level(served: list[Served], wall_s: float, events: int | None) -> dict[str, Any]:
    """The level's figures: aggregate tokens/s over its wall time, TTFT and inter-token latency
    percentiles, errors (429s with Retry-After counted apart: an answer; one without is an error),
    hangs, retried connections, and log events per generated token."""
    ok = [s for s in served if s.status == 200 and not s.error]
    tokens = sum(s.tokens for s in ok)
    ttfts = [s.ttft_ms for s in ok if s.ttft_ms is not None]
    gaps = [gap for s in ok for gap in s.gaps_ms]

    return {
        "requests": len(served),
        "served": len(ok),
        "tokens": tokens,
        "aggregate_tps": rounded(tokens / wall_s, 4) if wall_s > 0 else 0.0,
        "ttft_ms_p50": _percentile(ttfts, 0.5),
        "ttft_ms_p99": _percentile(ttfts, 0.99),
        "itl_ms_p50": _percentile(gaps, 0.5),
        "itl_ms_p99": _percentile(gaps, 0.99),
        "errors": sum(1 for s in served if s.failed),
        "hangs": sum(1 for s in served if s.hung),
        "refused_429": sum(1 for s in served if s.refused),
        "retries": sum(s.retries for s in served),
        "events_per_token": rounded(events / tokens, 3) if events is not None and tokens else None,
        "first_errors": sorted({s.error for s in served if s.error})[:3],
        "wall_s": rounded(wall_s, 4),
    }


async def stream_chat_retried(
    client: httpx.AsyncClient, model: str, max_tokens: int, attempts: int = CONNECT_ATTEMPTS
) -> Served:
    """`stream_chat`, sent again (as a client would) while its connection is refused or reset
    before any answer (mlx_lm.server's listening socket queues 5 connections, `http.server`); its
    TTFT counts from the first attempt, and the retries are counted."""
    first = time.perf_counter()
    served = await stream_chat(client, model, max_tokens)
    while served.status == 0 and not served.hung and served.retries < attempts:
        await asyncio.sleep(0.05 * (served.retries + 1))
        retries = served.retries + 1
        served = await stream_chat(client, model, max_tokens)
        served.retries = retries
    if served.ttft_ms is not None:
        served.ttft_ms += (served.sent_at - first) * 1000
    served.sent_at = first
    return served


async def run_alternating(
    base_url: str,
    models: Sequence[str],
    concurrency: int,
    requests_each: int,
    max_tokens: int,
    headers: Mapping[str, str] | None = None,
) -> list[tuple[str, Served]]:
    """`concurrency` clients at once, each sending `requests_each` requests in turn, alternating
    between `models`: client j's k-th request names `models[(j + k) % len(models)]`, so one client
    switches model on every request and, from two clients up, every model is asked for at once."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(
        base_url=base_url, timeout=httpx.Timeout(600.0), limits=limits, headers=dict(headers or {})
    ) as client:

        async def one_client(j: int) -> list[tuple[str, Served]]:
            out: list[tuple[str, Served]] = []
            for k in range(requests_each):
                model = models[(j + k) % len(models)]
                out.append((model, await stream_chat_retried(client, model, max_tokens)))
            return out

        per_client = await asyncio.gather(*(one_client(j) for j in range(concurrency)))
    return [served for done in per_client for served in done]
