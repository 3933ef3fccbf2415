"""An open `shoal up` on loopback (no API keys) against what a web page could make a browser send:
a form post, a rebound host name, a cross-origin preflight. Each is refused with a JSON error,
and the cluster serves the next request unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.timeout(240)

MESSAGES = [{"role": "user", "content": "Tell me about the river"}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("open"), workers=1)
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def _refused(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, code)
    return str(error["message"])


def test_ready_line_says_the_api_is_open(cluster: Cluster) -> None:
    assert "; API open: no API keys configured (loopback only)" in cluster.up.stdout_path.read_text()


def test_a_form_or_text_post_is_415(cluster: Cluster) -> None:
    with cluster.http() as http:
        form = http.post("/v1/chat/completions", data={"model": "tiny", "messages": "x"})
        assert "application/json" in _refused(form, 415, "unsupported_media_type")
        text = http.post("/v1/chat/completions", content=b'{"model": "tiny"}', headers={"content-type": "text/plain"})
        _refused(text, 415, "unsupported_media_type")
        _refused(http.post("/v1/tasks/task_0000000000000000/cancel", data={"a": "b"}), 415, "unsupported_media_type")
    answer = cluster.client().chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)  # pyright: ignore[reportArgumentType]
    assert answer.choices[0].message.content


def test_a_rebound_host_name_is_refused(cluster: Cluster) -> None:
    port = cluster.api_port
    with cluster.http() as http:
        rebound = http.get("/v1/models", headers={"host": f"rebound.example:{port}"})
        assert "rebound.example" in _refused(rebound, 400, "host_not_allowed")
        posted = http.post("/v1/chat/completions", json={}, headers={"host": f"rebound.example:{port}"})
        _refused(posted, 400, "host_not_allowed")
        assert http.get("/v1/models", headers={"host": f"localhost:{port}"}).status_code == 200
    local = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused", max_retries=0)
    assert [model.id for model in local.models.list()] == ["tiny"]


def test_cors_is_off_unless_configured(cluster: Cluster) -> None:
    asks = {"origin": "http://127.0.0.1:5173", "access-control-request-method": "POST"}
    with cluster.http() as http:
        preflight = http.options("/v1/chat/completions", headers=asks)
        assert "cors_origins: none" in _refused(preflight, 403, "cors_origin_not_allowed")
        assert "access-control-allow-origin" not in preflight.headers
        simple = http.get("/v1/models", headers={"origin": "http://127.0.0.1:5173"})
        assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers
