"""CPU time per generated token, per process, of a `shoal up --workers 1` cluster (one stream, or
`--concurrency` streams at once).

On a small machine every process that wakes per token takes its CPU out of the model's forward,
so this reads utime + stime (/proc/<pid>/stat) of `shoal up` (master, worker service, API),
nats-server and each runner around N streamed tokens, plus this client's own CPU. Figures in
CPU time are steadier than wall-clock rates on a shared machine.

    uv run python -m bench.cpu_per_token --tokens 400 --rounds 3
    uv run python -m bench.cpu_per_token --tokens 64 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.cluster import Cluster
from bench.serve_load import run_level

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def processes(cluster: Cluster) -> dict[str, int]:
    named = {"up": cluster.up.process.pid}
    named |= {f"runner{rank}": pid for (_, rank), pid in cluster.runner_pids().items()}
    named |= {f"nats-server{n or ''}": pid for n, pid in enumerate(cluster.nats_pids())}
    return named


def stream_tokens(http: httpx.Client, tokens: int) -> int:
    """One streamed chat completion of exactly `tokens` tokens; returns how many it generated."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "count the stones by the river"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    generated = 0
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    generated = int(usage["completion_tokens"])
    return generated


def concurrent_tokens(base_url: str, tokens: int, concurrency: int) -> int:
    """`concurrency` streamed chat completions at once, `tokens` each; how many they generated."""
    served = asyncio.run(run_level(base_url, "tiny", concurrency, 1, tokens))
    return sum(s.tokens for s in served)


def measure(tokens: int, rounds: int, concurrency: int = 1) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as root:
        cluster = Cluster(Path(root), workers=1).wait_ready(180)
        try:
            http = cluster.http()
            http.timeout = httpx.Timeout(300.0)
            stream_tokens(http, 32)  # warm-up
            pids = processes(cluster)
            per_round: list[dict[str, float]] = []
            for _ in range(rounds):
                before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                client_before = time.process_time()
                if concurrency == 1:
                    generated = stream_tokens(http, tokens)
                else:
                    generated = concurrent_tokens(str(http.base_url), tokens, concurrency)
                spent = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
                spent["client"] = time.process_time() - client_before
                per_round.append({name: round(1000 * s / max(generated, 1), 3) for name, s in spent.items()})
            return {"tokens": tokens, "concurrency": concurrency, "ms_cpu_per_token": per_round}
        finally:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="CPU time per generated token, per process, of shoal up --workers 1")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=1, help="streams at once, each of --tokens")
    args = parser.parse_args()
    print(json.dumps(measure(args.tokens, args.rounds, args.concurrency), indent=1))


if __name__ == "__main__":
    main()
