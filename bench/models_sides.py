"""`shoal bench models`' shoal side: `shoal up` serving both models, and what the bench asks of it
beyond requests: that both models are placed, a model unloaded through the admin API and then asked
for cold (load on demand), and the warm-ups the log recorded (`bench.warmups`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.cluster import Cluster
from bench.serve_load import stream_chat
from bench.warmups import Warmup, warmups

ADMIN_KEY = "bench-models-admin-0123456789abcdef"
HEADERS = {"authorization": f"Bearer {ADMIN_KEY}"}
POLL_SECONDS = 0.05


class ShoalModels:
    """`shoal up --workers N` with `models` set to both directories and one admin key."""

    def __init__(self, models: Sequence[str], root: Path, workers: int, min_nodes_per_instance: int) -> None:
        self.name = "shoal"
        home = root / "shoal"
        home.mkdir(parents=True)
        self.models = list(models)
        self.cluster = Cluster(
            home,
            workers=workers,
            env={"SHOAL_MIN_NODES_PER_INSTANCE": str(min_nodes_per_instance)},
            models=",".join(models),
            api_keys=f"{ADMIN_KEY}:admin",
            log_level="WARNING",
        )
        self.base_url = self.cluster.base_url

    def cards(self) -> dict[str, dict[str, Any]]:
        response = httpx.get(f"{self.base_url}/v1/models", headers=HEADERS, timeout=30)
        response.raise_for_status()
        return {card["id"]: card for card in response.json()["data"]}

    def wait_state(self, model: str, state: str, timeout: float) -> dict[str, Any]:
        """`model`'s card once its state is `state` (polled: the bench's own client, not a test)."""
        deadline = time.monotonic() + timeout
        card: dict[str, Any] = {}
        while time.monotonic() < deadline:
            card = self.cards()[model]
            if card["state"] == state:
                return card
            time.sleep(POLL_SECONDS)
        raise TimeoutError(f"{model} not {state} within {timeout}s: {card}\n{self.cluster.up.tail(3000)}")

    def wait_all_placed(self, timeout: float) -> dict[str, dict[str, Any]]:
        self.cluster.wait_ready(timeout)
        return {model: self.wait_state(model, "placed", timeout) for model in self.models}

    def cold(self, model: str, max_tokens: int, timeout: float) -> dict[str, Any]:
        """Unload `model` (admin API), wait until `/v1/models` says it is unloaded, then one streamed
        request for it: its TTFT is the load on demand's (placement, the runners' load and warm-up,
        the prefill), as a client sees it."""
        before = {i["instance_id"] for i in self.cards()[model]["instances"]}
        response = httpx.post(
            f"{self.base_url}/v1/admin/models/unload", json={"model": model}, headers=HEADERS, timeout=30
        )
        if response.status_code != 202:
            raise RuntimeError(f"unload {model}: HTTP {response.status_code} {response.text[:300]}")
        self.wait_state(model, "unloaded", timeout)
        served = asyncio.run(_one(self.base_url, model, max_tokens))
        if served.status != 200 or served.error or served.ttft_ms is None:
            raise RuntimeError(f"cold request for {model} failed: HTTP {served.status} {served.error}")
        after = [i["instance_id"] for i in self.cards()[model]["instances"]]
        return {
            "ttft_ms": served.ttft_ms,
            "tokens": served.tokens,
            "instance_id": after[0] if after else "",
            "new_instance": bool(after) and after[0] not in before,
        }

    def warmups(self) -> list[Warmup]:
        return asyncio.run(_read_warmups(self.cluster))

    def stop(self) -> None:
        self.cluster.stop()


async def _one(base_url: str, model: str, max_tokens: int) -> Any:
    async with httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(600.0), headers=HEADERS) as client:
        return await stream_chat(client, model, max_tokens)


async def _read_warmups(cluster: Cluster) -> list[Warmup]:
    from eventlog.log import EventLog

    log = await EventLog.connect(cluster.admin_endpoint(), name="shoal-bench-models", ensure=False)
    try:
        return warmups([(seq, event) async for seq, event in log.replay()])
    finally:
        await log.close()
