"""`shoal up --workers 2` driven by the official openai client: the paths a user takes."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.helpers import eos_banned, long_prompt, one_rank_text, task_state, wait_task_ended

pytestmark = pytest.mark.timeout(240)

PROMPT = "Tell me about the river"


def _stream_text(client: openai.OpenAI, prompt: str, max_tokens: int, **extra: object) -> tuple[str, str | None, str]:
    """(text, finish_reason, task id) of a streamed completion."""
    with client.chat.completions.with_streaming_response.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True, **extra
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        parts: list[str] = []
        finish: str | None = None
        for chunk in response.parse():
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
    return "".join(parts), finish, task_id


def test_greedy_output_streaming_or_not_equals_one_rank(cluster: Cluster) -> None:
    client = cluster.client()
    reference = one_rank_text(cluster.env, PROMPT, 12)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=12
    )
    completion = raw.parse()
    assert raw.headers["x-shoal-task-id"].startswith("task_")
    assert completion.choices[0].message.content == reference
    streamed, finish, _ = _stream_text(client, PROMPT, 12)
    assert streamed == reference
    assert finish == completion.choices[0].finish_reason


def test_max_tokens_and_usage(cluster: Cluster) -> None:
    completion = cluster.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=5
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens <= 5
    if completion.choices[0].finish_reason == "length":
        assert completion.usage.completion_tokens == 5
    assert completion.usage.prompt_tokens > 5


def test_stop_string_cuts_the_text(cluster: Cluster) -> None:
    client = cluster.client()
    full = one_rank_text(cluster.env, PROMPT, 16)
    stop = full[6:9]
    assert stop and stop in full
    completion = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=16, stop=[stop]
    )
    text = completion.choices[0].message.content or ""
    assert text == full[: full.index(stop)]
    assert completion.choices[0].finish_reason == "stop"


def test_eight_concurrent_requests_complete_in_fifo_order(cluster: Cluster) -> None:
    client = cluster.client(timeout=120)

    def ask(i: int) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": f"{PROMPT} {i}"}], max_tokens=6
        )
        assert raw.parse().choices[0].message.content is not None
        return raw.headers["x-shoal-task-id"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        task_ids = list(pool.map(ask, range(8)))
    with cluster.http() as http:
        states = [task_state(http, t) for t in task_ids]
    assert all(s["status"] == "completed" for s in states)
    by_assignment = sorted(states, key=lambda s: s["assigned_at"])
    assert [s["ended_seq"] for s in by_assignment] == sorted(s["ended_seq"] for s in states)


def test_progress_events_during_prefill(cluster: Cluster) -> None:
    client = cluster.client()
    seen: list[dict[str, int]] = []
    with client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": long_prompt(300)}],
        max_tokens=2,
        stream=True,
        stream_options={"include_progress": True},  # pyright: ignore[reportArgumentType]
    ) as stream:
        for chunk in stream:
            progress = getattr(chunk, "prompt_progress", None)
            if progress:
                seen.append(progress)
    assert len(seen) >= 3
    totals = {p["total"] for p in seen}
    assert len(totals) == 1
    processed = [p["processed"] for p in seen]
    assert processed == sorted(processed) and processed[-1] == totals.pop()


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_closing_the_stream_cancels_on_every_rank(cluster: Cluster, phase: str) -> None:
    client = cluster.client()
    prompt = long_prompt(600) if phase == "prefill" else PROMPT
    with client.chat.completions.with_streaming_response.create(
        model="tiny",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=2000 if phase == "decode" else 4,
        logit_bias=eos_banned(cluster.env),  # it ends by the client going away, never by an early EOS
        stream=True,
        stream_options={"include_progress": True},  # pyright: ignore[reportArgumentType]
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        for chunk in response.parse():
            in_prefill = (
                getattr(chunk, "prompt_progress", None) and chunk.model_extra["prompt_progress"]["processed"] > 0
            )  # pyright: ignore[reportOptionalSubscript]
            in_decode = chunk.choices and chunk.choices[0].delta.content
            if (phase == "prefill" and in_prefill) or (phase == "decode" and in_decode):
                break  # leaving the block closes the connection
    with cluster.http() as http:
        ended = wait_task_ended(http, task_id, timeout=20)
        assert ended["status"] == "cancelled", ended
        assert ended["cancel_reason"] == "client_disconnect"
        if phase == "prefill":
            assert ended["first_token_at"] == 0
            assert all(p["processed"] < p["total"] for p in ended["progress"].values())
    # every rank stopped and the group is reusable: the next answer equals the 1-rank one
    reference = one_rank_text(cluster.env, PROMPT, 8)
    completion = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=8
    )
    assert completion.choices[0].message.content == reference


def test_cancel_endpoint(cluster: Cluster) -> None:
    client = cluster.client()
    with client.chat.completions.with_streaming_response.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=2000,
        logit_bias=eos_banned(cluster.env),  # it ends by the cancel, never by an early EOS
        stream=True,
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        with cluster.http() as http:
            finish = None
            for chunk in response.parse():
                if chunk.choices and chunk.choices[0].delta.content and finish is None:
                    assert chunk.id == f"chatcmpl-{task_id}"  # the id a client sees names the task too
                    assert http.get(f"/v1/tasks/{chunk.id}").json()["task_id"] == task_id
                    assert http.post(f"/v1/tasks/{chunk.id}/cancel").status_code == 202
                    finish = "requested"
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.model_extra["shoal_finish_reason"]  # pyright: ignore[reportOptionalSubscript]
            assert finish == "cancelled"
            assert wait_task_ended(http, task_id)["status"] == "cancelled"
            again = http.post(f"/v1/tasks/{task_id}/cancel")
            assert again.status_code == 409 and "already ended" in again.json()["error"]["message"]
            assert http.post("/v1/tasks/task_nope/cancel").status_code == 404


def test_bad_input_gets_clear_errors(cluster: Cluster) -> None:
    with cluster.http() as http:
        bad_json = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
        wrong_type = http.post("/v1/chat/completions", json={"model": "tiny", "messages": "hello"})
        assert wrong_type.status_code == 400 and "$.messages" in wrong_type.json()["error"]["message"]
        bad_role = http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "bot", "content": "x"}]}
        )
        assert bad_role.status_code == 400 and "$.messages[0].role" in bad_role.json()["error"]["message"]
        too_many = http.post(
            "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
        )
        assert too_many.status_code == 400 and "limit of 4096" in too_many.json()["error"]["message"]
        unknown = http.post(
            "/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}
        )
        assert unknown.status_code == 404 and "known models: tiny" in unknown.json()["error"]["message"]
        huge = http.post("/v1/chat/completions", content=b" " * 2_000_000, headers={"content-type": "application/json"})
        assert huge.status_code == 413 and "limit" in huge.json()["error"]["message"]
        assert http.get("/v1/tasks/task_nope").status_code == 404


def test_config_models_health_metrics_openapi(cluster: Cluster) -> None:
    with cluster.http() as http:
        config = http.get("/v1/config").json()
        assert config["prefill_step_size"] == {"value": 64, "source": "env SHOAL_PREFILL_STEP_SIZE"}
        assert config["max_tokens_limit"]["source"] == "default"
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["tiny"]
        assert http.get("/v1/models/tiny").json() == http.get("/v1/models").json()["data"][0]
        assert cluster.client().models.retrieve("tiny").id == "tiny"
        missing = http.get("/v1/models/owner/absent")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        health = http.get("/healthz").json()
        assert health["status"] == "ok" and health["nodes_up"] == 2 and health["ready_instances"] == 1
        answered = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert http.post("/v1/chat/completions", json=answered).status_code == 200  # so the metrics have a TTFT
        metrics = http.get("/metrics").text
        assert "shoal_time_to_first_token_seconds_count" in metrics and "shoal_events_published_total" in metrics
        assert "/v1/chat/completions" in http.get("/openapi.json").json()["paths"]


def test_timeline_page_of_a_finished_task(cluster: Cluster) -> None:
    raw = cluster.client().chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": long_prompt(200)}], max_tokens=4
    )
    task_id = raw.headers["x-shoal-task-id"]
    with cluster.http() as http:
        page = http.get("/debug/timeline", params={"task": task_id})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "<svg" in page.text and task_id in page.text and "cdn" not in page.text.lower()
        missing = http.get("/debug/timeline", params={"task": task_id[:-1] + "x"})
        assert missing.status_code == 404 and task_id in missing.json()["error"]["message"]
        assert http.get("/debug/timeline").status_code == 400
