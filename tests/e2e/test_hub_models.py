"""`shoal up --model owner/name` on a real Hub-cache layout built here (no network): the ranks
resolve the id in the cache, the openai client chats with it and lists it with its owner, context
length and shard placement; an id that is neither cached nor reachable (downloads sent to a
closed local port) is reported in `shoal up`'s output, `/healthz` and `/v1/models`, never ready."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from runner.models.tiny import TinySpec, cached_tiny
from tests.e2e.cluster import Cluster, free_port
from tests.hub_cache import install_in_hub_cache

pytestmark = pytest.mark.timeout(240)

REPO = "owner/tiny-chat"
CACHED_ONLY = "owner/in-the-cache"  # in the nodes' cache, not configured: servable on demand


def _hub_env(cache: Path) -> dict[str, str]:
    """This cluster's own Hub cache, and a Hub endpoint nothing listens on: no test reaches the network."""
    return {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", "HF_HUB_OFFLINE": "0"}


@pytest.fixture(scope="module")
def hub_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("hub-cluster")
    install_in_hub_cache(root / "hub", REPO, cached_tiny())
    install_in_hub_cache(root / "hub", CACHED_ONLY, cached_tiny())
    running = Cluster(root, workers=2, env=_hub_env(root / "hub"), models=REPO)
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def test_a_hub_id_from_the_cache_serves_a_chat_completion(hub_cluster: Cluster) -> None:
    completion = hub_cluster.client().chat.completions.create(
        model=REPO, messages=[{"role": "user", "content": "Hello from the Hub cache"}], max_tokens=8
    )
    assert completion.model == REPO
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_the_models_list_names_the_owner_the_context_and_which_node_holds_which_layers(hub_cluster: Cluster) -> None:
    models = hub_cluster.client().models.list().data
    assert [m.id for m in models][:1] == [REPO] and CACHED_ONLY in [m.id for m in models]
    card: dict[str, Any] = models[0].model_dump()
    assert (card["owned_by"], card["context_length"], card["ready"], card["error"]) == (
        "owner",
        TinySpec().context,
        True,
        None,
    )
    assert card["created"] > 0
    (instance,) = card["instances"]
    assert instance["instance_id"] == hub_cluster.instance_id
    layers = [(s["node_id"], s["start_layer"], s["end_layer"]) for s in instance["shards"]]
    assert sorted(node for node, _, _ in layers) == ["node-0", "node-1"]
    assert layers[0][1] == 0 and layers[-1][2] == TinySpec().layers
    assert all(layers[i][2] == layers[i + 1][1] for i in range(len(layers) - 1))


def test_a_model_in_the_nodes_cache_is_listed_and_placed_on_its_first_request(hub_cluster: Cluster) -> None:
    with hub_cluster.http() as http:
        card = http.get(f"/v1/models/{CACHED_ONLY}").json()
    assert card["state"] in ("not_loaded", "placed"), card  # placed once a request asked for it
    completion = hub_cluster.client(timeout=120).chat.completions.create(
        model=CACHED_ONLY, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert completion.model == CACHED_ONLY and completion.choices[0].message.content
    with hub_cluster.http() as http:
        assert http.get(f"/v1/models/{CACHED_ONLY}").json()["state"] == "placed"


def test_an_id_neither_cached_nor_reachable_is_reported_everywhere_and_never_ready(tmp_path: Path) -> None:
    (tmp_path / "hub").mkdir()
    cluster = Cluster(tmp_path, workers=1, env=_hub_env(tmp_path / "hub"), models="owner/absent")
    try:
        with cluster.http() as http:
            health = _wait_for(lambda: http.get("/healthz").json(), lambda h: h["status"] == "model_unavailable")
            error = health["errors"]["owner/absent"]
            assert "'owner/absent' is neither in the Hugging Face cache" in error
            assert str(tmp_path / "hub") in error and "hf download owner/absent" in error
            (card,) = http.get("/v1/models").json()["data"]
            assert http.get("/v1/models/owner/absent").json() == card  # a Hub id's slash is part of the path
            assert (card["id"], card["owned_by"], card["ready"], card["error"]) == (
                "owner/absent",
                "owner",
                False,
                error,
            )
        output = cluster.up.tail(20000)
        assert "shoal: 'owner/absent' cannot be served: " in output and "neither in the Hugging Face cache" in output
        assert "shoal: ready" not in output
    finally:
        cluster.stop()


def _wait_for(fetch: Any, done: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = fetch()
            if done(last):
                return last
        except httpx.TransportError:
            pass  # the API is not listening yet
        time.sleep(0.5)
    raise TimeoutError(f"still {last!r} after {timeout}s")
