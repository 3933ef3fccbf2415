"""Orchestration across real hosts (issue 41): worker hosts with different memory budgets
(`node_memory_bytes`), three models configured where two fit, the third loaded on demand. Each model fits one
node, so each is placed on one; a model that needs room evicts the least recently used idle one,
never the one streaming; a node that joins takes the next placement; a node that leaves retires its
instance and its model is placed again on what remains. Every stream completes with its full text
(the log's chunks equal what the client got) or fails with a diagnosis, and no task is assigned twice
(`assert_checked`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.netclient import ClientCall, stream_chat, stream_in_thread
from bench.netcluster import API_KEY, NetCluster
from runner.models.tiny import TinySpec, cached_tiny, make_tiny
from tests.netns.conftest import assert_checked

pytestmark = pytest.mark.timeout(420)

MIB = 1 << 20
# The tiny model's weights are ~25 MiB (~31 MiB reserved with its KV room): a 40 MiB node holds one.
BUDGETS = {0: 40 * MIB, 1: 40 * MIB, 2: 100 * MIB}
BOUND = 90.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {
        "a": str(cached_tiny()),
        "b": str(make_tiny(root / "b", TinySpec(seed=3))),
        "c": str(make_tiny(root / "c", TinySpec(seed=5))),
    }


@pytest.fixture(scope="module")
def cluster(
    netns_available: None, tmp_path_factory: pytest.TempPathFactory, models: dict[str, str]
) -> Iterator[NetCluster]:
    running = NetCluster(
        tmp_path_factory.mktemp("netns-models"),
        workers=3,
        start_workers=2,  # w2 joins later
        settings={"models": ",".join(models.values()), "min_nodes_per_instance": "1"},
        worker_settings={index: {"node_memory_bytes": str(size)} for index, size in BUDGETS.items()},
    )
    try:
        yield running
    finally:
        running.stop()


def cards(cluster: NetCluster) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{cluster.base_url}/v1/models", headers={"authorization": f"Bearer {API_KEY}"}, timeout=10)
    response.raise_for_status()
    return {card["id"]: card for card in response.json()["data"]}


def wait_for(cluster: NetCluster, check: Callable[[dict[str, dict[str, Any]]], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    seen: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        try:
            seen = cards(cluster)
        except httpx.HTTPError:
            seen = {}
        if seen and check(seen):
            return
        time.sleep(0.3)
    raise AssertionError(f"never {what}: {seen}\n{cluster.tails()}")


def nodes_of(card: dict[str, Any]) -> list[str]:
    return [shard["node_id"] for instance in card["instances"] for shard in instance["shards"]]


def ask(cluster: NetCluster, model: str, max_tokens: int = 8) -> ClientCall:
    with cluster.http() as http:
        return stream_chat(http, "Tell me about the river", max_tokens, bound_seconds=BOUND, model=model)


def test_models_are_placed_by_memory_evicted_when_idle_and_follow_nodes_that_come_and_go(
    cluster: NetCluster, models: dict[str, str], tmp_path: Path
) -> None:
    a, b, c = models["a"], models["b"], models["c"]
    calls: list[ClientCall] = []
    wait_for(
        cluster,
        lambda m: m[a]["state"] == "placed" and m[b]["state"] == "placed" and m[c]["state"] == "cannot_fit",
        "the first two configured placed, the third waiting for room",
    )
    placed = cards(cluster)
    assert len(nodes_of(placed[a])) == 1 and len(nodes_of(placed[b])) == 1  # each fits one node
    assert sorted(nodes_of(placed[a]) + nodes_of(placed[b])) == ["w0", "w1"]  # one each: 40 MiB holds one
    assert "cannot fit" in placed[c]["error"]  # and it takes no one's room until a request asks for it

    # c on demand while a streams: b is idle (least recently used), a is busy and never evicted
    calls.append(ask(cluster, b))
    streaming = stream_in_thread(cluster.http, "Tell me a long story about the sea", 160, BOUND, model=a)
    wait_for(cluster, lambda m: m[a]["instances"][0]["held"] >= 1, "a streaming")
    calls.append(ask(cluster, c))
    streaming.join(BOUND + 10)
    calls.append(streaming.result)
    assert [call.outcome for call in calls] == ["completed"] * 3, calls
    now = cards(cluster)
    assert now[b]["state"] == "unloaded" and now[a]["state"] == "placed" and now[c]["state"] == "placed"

    # a node with room joins: the next model placed goes there, evicting nothing
    cluster.start_worker(cluster.workers[2])
    wait_for(cluster, lambda m: cluster.health().get("nodes_up") == 3, "w2 joined")
    calls.append(ask(cluster, b))
    now = cards(cluster)
    assert nodes_of(now[b]) == ["w2"] and now[a]["state"] == "placed" and now[c]["state"] == "placed"

    # the node leaves: its instance is retired, and b is placed again on what remains (evicting an idle one)
    cluster.procs["w2"].stop(grace=5)
    wait_for(cluster, lambda m: m[b]["state"] != "placed" or nodes_of(m[b]) != ["w2"], "b's instance on w2 retired")
    calls.append(ask(cluster, b))
    assert calls[-1].outcome == "completed", calls[-1]
    assert set(nodes_of(cards(cluster)[b])) <= {"w0", "w1"}
    assert_checked(cluster, calls)
