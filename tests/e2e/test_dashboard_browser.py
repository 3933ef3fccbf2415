"""The dashboard in headless Chromium, on a real `shoal up` whose rank 1 sleeps inside prefill
iteration 2 of its first task: an idle cluster, that task mid-prefill with each rank's progress,
then stalled and failed, then a chat typed into the page; and on a `shoal up` serving two models:
each node's reserved memory, each model's instance with its layers and placement reason, the
running batch apart from the queue with live tokens/s, an unloaded model draining, then loading
again on demand. Each screenshot is checked for what the page shows (read from the DOM after its
scripts ran), not only for existing.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.models.tiny import TinySpec, make_tiny
from tests.e2e.browser import CHROMIUM, Browser
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.helpers import long_prompt, task_state
from tests.ops.test_screenshot import count_colour, decode_png

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium not installed: apt-get update && apt-get install -y chromium"
    ),
]
SLEEPY = {"SHOAL_TEST_FAULT": "sleep:1:3:60"}  # rank 1, poll 3 = prefill iteration 2 of the first task
TYPE_AND_SEND = """
document.getElementById("chat-input").value = "Tell me about rivers";
document.getElementById("chat-max-tokens").value = "12";
document.querySelector("#chat-form button").click();
"""
RUNNING_BLUE, FAILED_RED = "#1d4ed8", "#fee2e2"  # dashboard.css: progress bars, the failed badge


@pytest.fixture(scope="module")
def sleepy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path_factory.mktemp("sleepy"), workers=2, env=SLEEPY, **E2E_SETTINGS)
    try:
        yield cluster.wait_ready()
    finally:
        cluster.stop()


def first_snapshot(cluster: Cluster) -> dict[str, Any]:
    """What the feed says first, read as any client would (the page must show the same)."""
    with cluster.http() as http, http.stream("GET", "/v1/dashboard/events") as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                return json.loads(line[6:])
    raise AssertionError("the feed ended before its snapshot")


def start_long_chat(cluster: Cluster, ids: list[str]) -> threading.Thread:
    """A streamed chat with a long prompt, in a thread (it ends when the task fails)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": long_prompt(120)}], "stream": True}

    def chat() -> None:
        with cluster.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as response:
            ids.append(response.headers["x-shoal-task-id"])
            for _ in response.iter_lines():
                pass

    thread = threading.Thread(target=chat, daemon=True)
    thread.start()
    return thread


def screenshot(browser: Browser, path: Path, colour: str) -> int:
    width, height, rows = decode_png(browser.screenshot(path))
    assert (width, height) == (1280, 900)
    return count_colour(rows, colour)


def test_the_dashboard_shows_the_cluster_a_prefill_by_rank_and_a_stall(sleepy: Cluster, tmp_path: Path) -> None:
    snapshot = first_snapshot(sleepy)
    nodes = [node["node_id"] for node in snapshot["nodes"]]
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(sleepy.base_url + "/")
        # Idle: every node, the instance with its shards placed on them, no task.
        shown = browser.wait_for_text("body", *nodes, sleepy.instance_id, "ready", "No tasks yet.", "live")
        # The one the cluster waited for (on a loaded host a placement may have timed out before it)
        (instance,) = [i for i in snapshot["instances"] if i["instance_id"] == sleepy.instance_id]
        for shard in instance["shards"]:
            assert f"rank {shard['rank']} on {shard['node_id']}" in shown.replace("\n", " ")
        screenshot(browser, tmp_path / "idle.png", RUNNING_BLUE)

        ids: list[str] = []
        chat = start_long_chat(sleepy, ids)
        # Mid-prefill: both ranks started; rank 1 sleeps in iteration 2, rank 0 waits on it.
        row = f'tr[data-task="{task_id(ids)}"]'
        browser.wait_for_text(row, "prefilling", "rank 0", "rank 1")
        shown, progress = shown_progress(browser, row, sleepy, ids[0])
        assert ids[0] in shown and any(p["processed"] > 0 for p in progress.values()), (shown, progress)
        assert screenshot(browser, tmp_path / "prefill.png", RUNNING_BLUE) > 30  # the progress bars

        # Stalled: the master's deadline passes, the task fails with the stall's diagnosis.
        shown = browser.wait_for_text(row, "failed", "stalled", timeout=90)
        assert "rank 1" in shown, shown
        assert screenshot(browser, tmp_path / "stalled.png", FAILED_RED) > 50
        chat.join(30)
        assert browser.evaluate(f"document.querySelector('{row} a').getAttribute('href')") == (
            f"/debug/timeline?task={ids[0]}"
        )
    finally:
        browser.close()


def test_the_chat_box_streams_through_the_public_api(tmp_path: Path) -> None:
    """On a cluster without faults (a replacement runner would sleep in its first task too)."""
    cluster = Cluster(tmp_path, workers=1, **E2E_SETTINGS)
    browser = Browser(tmp_path / "profile")
    try:
        cluster.wait_ready()
        browser.open(cluster.base_url + "/")
        browser.wait_for_text("body", cluster.instance_id, "ready", "live")
        browser.evaluate(TYPE_AND_SEND)
        shown = browser.wait_for_text("#tasks", "completed (length)", "12")
        reply = browser.text("#chat-output")
        with cluster.http() as http:
            (task,) = [t for t in http.get("/metrics").text.splitlines() if t.startswith("shoal_tasks_completed_total")]
        assert task.endswith(" 1.0") and reply.strip(), (task, reply, shown)
    finally:
        browser.close()
        cluster.stop()


def shown_progress(browser: Browser, row: str, cluster: Cluster, task: str) -> tuple[str, dict[str, Any]]:
    """The task's row once it shows every rank's progress as the API reports it at that moment,
    past the first chunk (both are read again until they agree: the ranks may still be moving; the
    row read before any chunk was done showed 0/567 for both, agreeing with the API)."""
    shown, progress = "", {}
    with cluster.http() as http:
        for _ in range(100):
            progress = task_state(http, task)["progress"]
            shown = browser.text(row)
            moved = any(p["processed"] > 0 for p in progress.values())
            if (
                len(progress) == 2
                and moved
                and all(f"{p['processed']}/{p['total']}" in shown for p in progress.values())
            ):
                return shown, progress
            threading.Event().wait(0.1)
    raise AssertionError(f"the row never showed the progress {progress}: {shown}")


def task_id(ids: list[str]) -> str:
    """The long chat's task id, once its response headers came."""
    for _ in range(300):
        if ids:
            return ids[0]
        threading.Event().wait(0.1)
    raise TimeoutError("the chat never answered")


NODE_MEMORY = 64 << 20  # each node's budget, so the models' few MiB show on its meter


def stream_chats(cluster: Cluster, model: str, count: int, stop: threading.Event) -> list[threading.Thread]:
    """`count` long streamed chats with `model`, each read until `stop` (then its client goes away,
    which cancels its task)."""
    body = {"model": model, "messages": [{"role": "user", "content": "Tell me about rivers"}], "max_tokens": 2000}

    def chat() -> None:
        with cluster.http() as http, http.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    threads = [threading.Thread(target=chat, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def mib(size: int) -> str:
    """As the page writes a size under a GiB (dashboard.js `gib`)."""
    value = size / 2**20
    return f"{value:.1f} MiB" if 0 < value < 10 else f"{int(value + 0.5)} MiB"


def test_the_dashboard_shows_two_models_their_batches_rates_memory_draining_and_loading(tmp_path: Path) -> None:
    other = str(make_tiny(tmp_path / "models" / "other", TinySpec(layers=4, seed=7)))
    cluster = Cluster(
        tmp_path / "cluster",
        workers=2,
        env={"SHOAL_MIN_NODES_PER_INSTANCE": "1"},  # placement's own choice: each model on one node
        models=f"tiny,{other}",
        node_memory_bytes=str(NODE_MEMORY),
        max_batch="1",  # a second request on one instance waits in its queue
    )
    browser = Browser(tmp_path / "profile")
    stop = threading.Event()
    try:
        cluster.wait_ready()
        browser.open(cluster.base_url + "/")
        snapshot = both_ready(cluster)
        # Each model's instance: its node, its layers, what it reserves there and why it sits there.
        instances = {i["model"]: i for i in snapshot["instances"]}
        for model, layers in (
            ("tiny", "layers 0\u20137"),
            (other, "layers 0\u20133"),
        ):  # en dashes, as the page writes them
            instance = instances[model]
            (shard,) = instance["shards"]
            box = browser.wait_for_text(f'[data-instance="{instance["instance_id"]}"]', layers, shard["node_id"])
            assert f"{mib(shard['memory_bytes'])} reserved" in box and instance["placement_reason"] in box, box
        # Each node: what the instances on it reserve, of its budget.
        for node in snapshot["nodes"]:
            row = browser.text(f'tr[data-node="{node["node_id"]}"]')
            assert f"{mib(node['reserved_bytes'])} of {mib(NODE_MEMORY)}" in row and node["reserved_bytes"] > 0, row

        # Two long chats on tiny: one in the batch, one queued behind it; tokens/s once it decodes.
        tiny = instances["tiny"]["instance_id"]
        chats = stream_chats(cluster, "tiny", 2, stop)
        box = f'[data-instance="{tiny}"]'
        shown = browser.wait_for_text(box, "running 1", "queued 1")
        rate = wait_for_rate(browser, tiny)
        assert screenshot(browser, tmp_path / "two-models.png", RUNNING_BLUE) > 30, (shown, rate)

        # An operator unloads tiny: its instance drains while its tasks run, then retires.
        with cluster.http() as http:
            http.post("/v1/admin/models/unload", json={"model": "tiny"}).raise_for_status()
        browser.wait_for_text(box, "draining", "running 1")
        browser.wait_for_text('[data-model="tiny"]', "draining")
        stop.set()
        for chat in chats:
            chat.join(60)
        browser.wait_for_text('[data-model="tiny"]', f"retired {tiny}", "unloaded")

        # A request for it places it again: the page shows it waiting or loading, then ready.
        again = stream_chats(cluster, "tiny", 1, threading.Event())
        seen = wait_for_states(browser, '[data-model="tiny"]', {"waiting", "loading"}, "ready")
        assert seen & {"waiting", "loading"}, seen
        again[0].join(120)
    finally:
        stop.set()
        browser.close()
        cluster.stop()


def both_ready(cluster: Cluster, timeout: float = 120.0) -> dict[str, Any]:
    """The feed's snapshot once both models' instances are ready."""
    snapshot: dict[str, Any] = {}
    for _ in range(int(timeout * 5)):
        snapshot = first_snapshot(cluster)
        if len([i for i in snapshot["instances"] if i["state"] == "ready"]) == 2:
            return snapshot
        threading.Event().wait(0.2)
    raise AssertionError(f"the two models were never both ready: {snapshot}")


def wait_for_rate(browser: Browser, instance: str, timeout: float = 60.0) -> float:
    """The instance's tokens/s once the page shows it making some."""
    for _ in range(int(timeout * 5)):
        shown = browser.text(f'[data-rate="{instance}"]')
        found = re.match(r"([0-9.]+) tok/s", shown)
        if found and float(found.group(1)) > 0:
            return float(found.group(1))
        threading.Event().wait(0.2)
    raise AssertionError(f"{instance} never showed tokens/s: {browser.text('#models')}")


def wait_for_states(browser: Browser, selector: str, wanted: set[str], final: str, timeout: float = 120.0) -> set[str]:
    """The states among `wanted` that `selector`'s badges showed before it showed `final`."""
    seen: set[str] = set()
    for _ in range(int(timeout * 10)):
        badges = browser.evaluate(
            f"[...document.querySelectorAll({json.dumps(selector + ' .badge')})].map((b) => b.textContent)"
        )
        seen |= wanted & set(badges or [])
        if final in (badges or []):
            return seen
        threading.Event().wait(0.1)
    raise AssertionError(f"{selector} never showed {final}: {browser.text(selector)}")
