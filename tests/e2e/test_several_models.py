"""Several models on one real cluster (`shoal up --workers 2` with two models): each placed on the
fewest nodes that hold it, both served through the official openai client, `/v1/models` saying where
each stands; an operator's unload drains, a request places the model again; an idle model is
unloaded after its keep-alive and placed again on demand; `shoal placement explain` says why
(docs/ARCHITECTURE.md §5, README "Several models")."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from runner.models.tiny import TinySpec, make_tiny
from tests.e2e.cluster import Cluster, shoal_argv

pytestmark = pytest.mark.timeout(300)

KEEP_ALIVE_S = 6.0
ADMIN = "models-admin-key-0123456789:admin"
HEADERS = {"authorization": f"Bearer {ADMIN.removesuffix(':admin')}"}


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_tiny(tmp_path_factory.mktemp("models") / "other", TinySpec(layers=4, seed=7)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, other_model: str) -> Iterator[Cluster]:
    running = Cluster(
        tmp_path_factory.mktemp("cluster"),
        workers=2,
        env={"SHOAL_MIN_NODES_PER_INSTANCE": "1"},  # placement's own choice: the fewest nodes
        models=f"tiny,{other_model}",
        model_keep_alive_seconds=str(KEEP_ALIVE_S),
        api_keys=ADMIN,
    )
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def cards(cluster: Cluster) -> dict[str, dict[str, Any]]:
    response = httpx.get(f"{cluster.base_url}/v1/models", headers=HEADERS, timeout=10)
    response.raise_for_status()
    return {card["id"]: card for card in response.json()["data"]}


def wait_for(cluster: Cluster, model: str, ok: Callable[[dict[str, Any]], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    card: dict[str, Any] = {}
    while time.monotonic() < deadline:
        card = cards(cluster)[model]
        if ok(card):
            return
        time.sleep(0.2)
    raise AssertionError(f"{model} never {what}: {card}\n{cluster.up.tail(3000)}")


def ask(cluster: Cluster, model: str) -> str:
    client = cluster.client(timeout=120)
    client.api_key = HEADERS["authorization"].removeprefix("Bearer ")
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0
    )
    return answer.choices[0].message.content or ""


def test_both_models_are_placed_each_on_one_node_and_both_answer(cluster: Cluster, other_model: str) -> None:
    for model in ("tiny", other_model):
        wait_for(cluster, model, lambda c: c["state"] == "placed", "placed", 120)
    placed = cards(cluster)
    for model in ("tiny", other_model):
        [instance] = placed[model]["instances"]
        assert len(instance["shards"]) == 1, instance  # a model that fits one node runs on one node
        assert "fewest nodes" in instance["placement"]
        assert instance["shards"][0]["memory_bytes"] > 0
        assert ask(cluster, model)
    assert ask(cluster, "tiny") == ask(cluster, "tiny")  # greedy: the same text twice


def test_an_unloaded_model_is_placed_again_by_the_next_request(cluster: Cluster, other_model: str) -> None:
    wait_for(cluster, other_model, lambda c: c["state"] == "placed", "placed", 120)
    before = cards(cluster)[other_model]["instances"][0]["instance_id"]
    response = httpx.post(
        f"{cluster.base_url}/v1/admin/models/unload", json={"model": other_model}, headers=HEADERS, timeout=10
    )
    assert response.status_code == 202, response.text
    wait_for(cluster, other_model, lambda c: c["state"] == "unloaded", "unloaded", 60)
    assert ask(cluster, other_model)  # waits for its placement, then answers
    after = cards(cluster)[other_model]["instances"]
    assert after and after[0]["instance_id"] != before


def test_an_idle_model_is_unloaded_after_its_keep_alive_and_served_again_on_demand(cluster: Cluster) -> None:
    assert ask(cluster, "tiny")
    wait_for(cluster, "tiny", lambda c: c["state"] == "unloaded", "unloaded for idleness", KEEP_ALIVE_S * 10)
    assert ask(cluster, "tiny")
    assert cards(cluster)["tiny"]["state"] == "placed"


def test_load_with_pin_keeps_it_and_placement_explain_says_why(cluster: Cluster) -> None:
    response = httpx.post(
        f"{cluster.base_url}/v1/admin/models/load", json={"model": "tiny", "pin": True}, headers=HEADERS, timeout=10
    )
    assert response.status_code == 202, response.text
    wait_for(cluster, "tiny", lambda c: c["state"] == "placed" and c["pinned"], "placed and pinned", 120)
    env = {**cluster.env, "SHOAL_NATS_URL": cluster.nats_url}  # its data dir: the admin identity its server made
    explain = subprocess.run(
        shoal_argv("placement", "explain", "tiny", "--nats-url", cluster.nats_url),
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert explain.returncode == 0, explain.stderr
    assert "pinned by an operator" in explain.stdout and "why: needs" in explain.stdout
    assert "retired (idle)" in explain.stdout  # the earlier instance, unloaded for idleness


def test_refused_admin_actions_say_what_to_fix(cluster: Cluster) -> None:
    base = cluster.base_url
    plain = httpx.post(f"{base}/v1/admin/models/load", json={"model": "tiny"}, timeout=10)
    assert plain.status_code == 401
    unknown = httpx.post(f"{base}/v1/admin/models/load", json={"model": "no-such"}, headers=HEADERS, timeout=10)
    assert unknown.status_code == 404 and "model directory" in unknown.json()["error"]["message"]
    bad = httpx.post(f"{base}/v1/admin/models/load", json={"model": "tiny", "min_nodes": 0}, headers=HEADERS)
    assert bad.status_code == 400
    assert ask(cluster, "tiny")  # the next ordinary request is served
