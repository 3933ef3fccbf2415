"""What an operator points at a cluster: /livez and /readyz, JSON log lines with one access line per
request (the key's id, never the key), and the Grafana dashboard in deploy/grafana, whose every
query names a metric this cluster's /metrics exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.api.auth import key_id
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.timeout(180)

KEY = "sk-operator-test-key-0123"
DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "shoal.json"
SERIES_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
METRIC = re.compile(r"\b(?:shoal|process)_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=1, api_keys=KEY, log_format="json")
    try:
        yield running.wait_ready()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def http(cluster: Cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster.base_url, timeout=60, headers={"authorization": f"Bearer {KEY}"}) as client:
        yield client


@pytest.fixture(scope="module")
def task_id(http: httpx.Client) -> str:
    """One completed chat request: its task's metrics and access line exist from here on."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Tell me about the river"}], "max_tokens": 4}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.headers["x-shoal-task-id"]


def test_livez_answers_and_readyz_says_a_model_can_be_served(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.base_url) as anonymous:  # a load balancer has no key
        live = anonymous.get("/livez")
        ready = anonymous.get("/readyz")
        health = anonymous.get("/healthz")
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    assert (ready.status_code, ready.json()) == (200, {"ready": True, "status": "ok", "reason": ""})
    assert health.status_code == 200 and health.json()["status"] == "ok"


def _log_records(cluster: Cluster) -> list[dict[str, Any]]:
    lines = [line for line in cluster.up.stderr_path.read_text().splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # every line is one JSON object: a text line fails here


def test_log_lines_are_json_with_an_access_line_per_request_naming_the_key_by_id(
    cluster: Cluster, http: httpx.Client, task_id: str
) -> None:
    assert http.get("/v1/nothing-here").status_code == 404
    cluster.up.wait_for_log_line(re.compile(r"GET unmatched 404"), timeout=30)
    cluster.up.wait_for_log_line(re.compile(rf"POST chat 200 key=\S+ task={task_id}"), timeout=30)
    records = _log_records(cluster)
    assert all({"text", "record"} <= set(r) for r in records)  # loguru's serializer
    access = [r["record"]["extra"]["access"] for r in records if "access" in r["record"]["extra"]]
    chat = [a for a in access if a["task_id"] == task_id]
    assert len(chat) == 1
    assert chat[0]["method"] == "POST" and chat[0]["route"] == "chat" and chat[0]["status"] == 200
    assert chat[0]["key_id"] == key_id(KEY) and chat[0]["duration_ms"] > 0
    assert {"method": "GET", "route": "unmatched", "status": 404} in [
        {k: a[k] for k in ("method", "route", "status")} for a in access
    ]
    assert KEY not in cluster.up.stderr_path.read_text()  # the key itself is never logged


def test_every_dashboard_query_names_a_metric_the_server_exports(http: httpx.Client, task_id: str) -> None:
    exposition = http.get("/metrics")
    assert exposition.status_code == 200
    exported: set[str] = set()
    for family in text_string_to_metric_families(exposition.text):
        # a family with no sample yet (no task has failed) still names its series: a counter's
        # `_total`, a histogram's `_bucket`, `_sum` and `_count`
        exported.update(family.name + suffix for suffix in SERIES_SUFFIXES.get(family.type, ("",)))
        exported.update(sample.name for sample in family.samples)
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        exprs = [target["expr"] for target in panel["targets"]]
        named = {name for expr in exprs for name in METRIC.findall(expr)}
        assert named, f"panel {panel['title']!r} queries no shoal or process metric"
        assert named <= exported, f"panel {panel['title']!r} queries {sorted(named - exported)}, not exported"
