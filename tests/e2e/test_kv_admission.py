"""Admission by KV memory on a real `shoal up` cluster of 2 workers: with `kv_cache_bytes` holding
about two requests' prompt + max_tokens per rank, concurrent requests are all served (the others
wait their turn in the queue), and one that could never fit fails at once with a message naming
the setting, without holding up the rest."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from runner.models.tiny import cached_tiny
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.timeout(240)
CAPACITY = 300  # KV positions per rank: two requests of ~20 prompt tokens + 100 at once, not three


def kv_bytes_per_token_of_four_layers() -> int:
    config = json.loads((cached_tiny() / "config.json").read_text())
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    return 4 * 2 * config["num_key_value_heads"] * head_dim * 4  # 4 layers per rank, keys and values, float32


async def _requests(base_url: str) -> tuple[list[httpx.Response], httpx.Response]:
    def body(max_tokens: int, text: str) -> dict[str, object]:
        return {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}

    async with httpx.AsyncClient(base_url=base_url, timeout=120.0) as client:
        fitting = [client.post("/v1/chat/completions", json=body(100, f"hello {k}")) for k in range(4)]
        huge = client.post("/v1/chat/completions", json=body(1000, "too long a reply"))
        *served, refused = await asyncio.gather(*fitting, huge)
        return served, refused


def test_requests_beyond_the_kv_wait_their_turn_and_one_that_never_fits_fails_saying_why(tmp_path: Path) -> None:
    kv_bytes = CAPACITY * kv_bytes_per_token_of_four_layers()
    cluster = Cluster(tmp_path, workers=2, kv_cache_bytes=str(kv_bytes)).wait_ready()
    try:
        served, refused = asyncio.run(_requests(cluster.base_url))
        for response in served:
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] > 0
        assert refused.status_code == 400, refused.text  # the request itself: not worth a retry
        assert refused.json()["error"]["type"] == "invalid_request_error"
        message = refused.json()["error"]["message"]
        assert f"holds at most {CAPACITY}" in message and "kv_cache_bytes" in message, message
    finally:
        cluster.stop()
