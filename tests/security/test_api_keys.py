"""API keys on a live `shoal up` (real nats-server, real API): who may call what, and whose task is
whose. Two user keys from SHOAL_API_KEYS, an admin key from a 0600 key file; the official openai
client where a user would use it, httpx where the request itself is the point."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import httpx
import openai
import pytest

from eventlog.export import read_export
from events.catalogue import TaskAssigned, TaskCreated
from events.codec import ExportRecord
from services.api.auth import key_id
from services.master.fair_share import handed_ahead
from tests.e2e.cluster import Cluster, shoal_argv
from tests.e2e.helpers import story_on_failure, wait_task_ended

pytestmark = pytest.mark.timeout(240)

ALICE = "alice-0123456789abcdef0123"
BOB = "bob-0123456789abcdef01234"
ADMIN = "admin-0123456789abcdef0123"
APP_ORIGIN = "http://app.example:3000"
PROMPT = "Tell me about the river"
FAIR_BATCH = 2  # the instance holds 2 + handed_ahead(2) = 4 tasks; the others wait at the master
HANDED_AHEAD = handed_ahead(FAIR_BATCH)  # the tasks the master hands an instance beyond the streams it runs


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("keyed")
    keys_file = root / "api-keys"
    keys_file.write_text(f"# operators\n{ADMIN}:admin\n")
    keys_file.chmod(0o600)
    running = Cluster(
        root,
        workers=1,
        api_keys=f"{ALICE},{BOB}",
        api_keys_file=str(keys_file),
        cors_origins=APP_ORIGIN,
        max_batch=str(FAIR_BATCH),  # small, so a flood of a few requests fills the instance
    )
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def _client(cluster: Cluster, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key=key, timeout=60, max_retries=0)


def _http(cluster: Cluster, key: str | None) -> httpx.Client:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=cluster.base_url, headers=headers, timeout=30)


def _assert_refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json() == {
        "error": {
            "message": response.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": None,
            "code": code,
        }
    }
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_ready_line_says_keys_are_required(cluster: Cluster) -> None:
    assert "; API keys required (3 keys, 1 admin)" in cluster.up.stdout_path.read_text()


def test_no_key_and_a_wrong_key_are_401(cluster: Cluster) -> None:
    with _http(cluster, None) as http:
        _assert_refused(http.get("/v1/models"), 401, "missing_api_key")
        body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}]}
        _assert_refused(http.post("/v1/chat/completions", json=body), 401, "missing_api_key")
        _assert_refused(http.get("/metrics"), 401, "missing_api_key")
        assert http.get("/healthz").json()["ready_instances"] == 1  # probes need no key
    with pytest.raises(openai.AuthenticationError) as caught:
        _client(cluster, "wrong-0123456789abcdef0123").models.list()
    assert caught.value.status_code == 401 and "wrong-0123" not in str(caught.value)
    assert [model.id for model in _client(cluster, BOB).models.list()] == ["tiny"]


def test_a_second_key_cannot_read_or_cancel_the_first_keys_task(cluster: Cluster) -> None:
    done = _client(cluster, ALICE).chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=4
    )
    finished_id = done.headers["x-shoal-task-id"]
    with _client(cluster, ALICE).chat.completions.with_streaming_response.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=2000, stream=True
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        with _http(cluster, BOB) as bob, _http(cluster, ALICE) as alice:
            nothing = bob.get("/v1/tasks/task_0000000000000000")
            for probe in (bob.get(f"/v1/tasks/{task_id}"), bob.post(f"/v1/tasks/{task_id}/cancel")):
                assert probe.status_code == 404
                assert probe.json() == {
                    "error": {**nothing.json()["error"], "message": f"task {task_id!r} does not exist"}
                }  # exactly what a task that never existed gets
                assert finished_id not in probe.text
            assert bob.get(f"/v1/tasks/{finished_id}").status_code == 404
            mine = alice.get(f"/v1/tasks/{task_id}").json()
            assert mine["owner"] == key_id(ALICE) and mine["status"] != "cancelled"
            assert ALICE not in alice.get(f"/v1/tasks/{task_id}").text
            assert alice.post(f"/v1/tasks/{task_id}/cancel").status_code == 202
        finish = None
        for chunk in response.parse():
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.model_extra["shoal_finish_reason"]  # pyright: ignore[reportOptionalSubscript]
    assert finish == "cancelled"
    with _http(cluster, ADMIN) as admin:  # an operator sees every task
        assert wait_task_ended(admin, task_id)["cancel_reason"] == "api"
        assert admin.get(f"/v1/tasks/{finished_id}").json()["owner"] == key_id(ALICE)


def test_one_keys_prompt_is_never_served_from_another_keys_cache(cluster: Cluster) -> None:
    """The prefix cache is per key: Bob sending Alice's prompt reuses none of her KV, so neither his
    `cached_tokens` nor his time to first token says what she sent; Alice's own next request does."""
    history = " ".join(["quietly the river remembers every stone it has carried"] * 12)  # a raw prompt:
    # no chat template's head, which every chat request of a key shares with its earlier ones

    def cached(key: str) -> int:
        completion = _client(cluster, key).completions.create(model="tiny", prompt=history, max_tokens=4)
        assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
        return completion.usage.prompt_tokens_details.cached_tokens or 0

    assert cached(ALICE) == 0
    assert cached(BOB) == 0
    assert cached(ALICE) > 100


def test_another_keys_request_is_served_beside_a_flood_not_behind_it(cluster: Cluster, tmp_path: Path) -> None:
    """Alice holds both of the instance's rows with two long streams and queues 8 short ones behind
    them: 2 handed ahead to the instance, 6 waiting at the master. Bob's one request comes last. When
    one of her long streams is cancelled, the place it frees goes to her first task handed ahead, and
    the next one the master hands over is Bob's, before any of her 6 waiting
    (`services/master/fair_share.py`): in the log his task is assigned before theirs, and his stream
    ends before theirs. Served in the log's order, it would be assigned and end after all of them.

    Nothing frees a place until the test cancels, so when Bob's task reaches the log does not decide
    the order. (Waiting for places to free by themselves, a loaded machine once brought Bob's request
    to the log only as her last streams were handed over.)"""
    started: queue.Queue[str] = queue.Queue()

    def stream(key: str, max_tokens: int) -> Streamed:
        body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens}
        if max_tokens > 64:  # a long stream says one token over and over: it ends only when cancelled
            body["logit_bias"] = {"42": 100}
        with (
            _http(cluster, key) as http,
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as response,
        ):
            assert response.status_code == 200, response.read()
            task_id = response.headers["x-shoal-task-id"]
            started.put(task_id)  # the headers come once the task is in the log
            lines = [line for line in response.iter_lines() if line]
        assert lines[-1] == "data: [DONE]", lines[-3:]
        last = json.loads(lines[-2].removeprefix("data: "))
        finish = last.get("shoal_finish_reason") or last["choices"][0]["finish_reason"]
        return Streamed(task_id, finish, time.monotonic())

    def start(
        pool: ThreadPoolExecutor, key: str, max_tokens: int, count: int
    ) -> tuple[list[str], list[Future[Streamed]]]:
        streams = [pool.submit(stream, key, max_tokens) for _ in range(count)]
        try:
            return [started.get(timeout=60) for _ in streams], streams
        except queue.Empty:
            for future in streams:
                if future.done():
                    future.result()  # a stream that failed before its headers: its own error
            raise

    with story_on_failure(cluster), ThreadPoolExecutor(11) as pool, _http(cluster, ALICE) as alice:
        long_ids, long = start(pool, ALICE, 3000, FAIR_BATCH)  # the rows: no place frees until one is cancelled
        short_ids, short = start(pool, ALICE, 64, 8)
        _wait_handed_ahead(alice, short_ids, HANDED_AHEAD)
        _, [bob] = start(pool, BOB, 64, 1)
        assert alice.post(f"/v1/tasks/{long_ids[0]}/cancel").status_code == 202
        ended = [future.result(timeout=120) for future in [*short, bob]]
        assert alice.post(f"/v1/tasks/{long_ids[1]}/cancel").status_code == 202
        assert [future.result(timeout=120).finish for future in long] == ["cancelled", "cancelled"]
    assert [streamed.finish for streamed in ended] == ["length"] * 9, ended
    *hers, his = ended

    log = _exported_log(cluster, tmp_path / "log.jsonl")
    created, assigned = _seqs(log, TaskCreated), _seqs(log, TaskAssigned)
    waiting = [task.task_id for task in hers if assigned[task.task_id] > created[his.task_id]]
    assert len(waiting) == 8 - HANDED_AHEAD, (waiting, created, assigned)  # none handed ahead past the quota
    assert all(assigned[his.task_id] < assigned[task_id] for task_id in waiting), (his, created, assigned)
    ended_at = {streamed.task_id: streamed.at for streamed in ended}
    assert all(ended_at[his.task_id] < ended_at[task_id] for task_id in waiting), ended


def _wait_handed_ahead(http: httpx.Client, task_ids: list[str], count: int) -> None:
    """Until the master has handed `count` of the tasks to the instance ahead of a free place (the
    rest wait at the master): Bob's request comes after that, whatever the master's pace."""
    deadline = time.monotonic() + 60
    while True:
        statuses = [http.get(f"/v1/tasks/{task_id}").json()["status"] for task_id in task_ids]
        handed = sum(status != "created" for status in statuses)
        assert handed <= count, statuses  # past the quota: the fair share is broken
        if handed == count:
            return
        assert time.monotonic() < deadline, f"the master handed {handed} of {count} ahead in 60 s: {statuses}"
        time.sleep(0.05)


class Streamed(NamedTuple):
    task_id: str
    finish: str
    at: float  # when the client read the stream's end


def _exported_log(cluster: Cluster, path: Path) -> list[ExportRecord]:
    env = {**cluster.env, "SHOAL_NATS_URL": cluster.nats_url}  # its data dir: the admin identity
    argv = shoal_argv("events", "export", "-o", str(path))
    exported = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    return read_export(path)


def _seqs(log: list[ExportRecord], kind: type[TaskCreated | TaskAssigned]) -> dict[str, int]:
    """The log position of each task's first event of `kind`, by task id."""
    seqs: dict[str, int] = {}
    for record in log:
        if isinstance(record.event, kind):
            seqs.setdefault(record.event.task_id, record.seq)
    return seqs


def test_debug_and_config_need_an_admin_key(cluster: Cluster) -> None:
    task_id = (
        _client(cluster, ALICE)
        .chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=2
        )
        .headers["x-shoal-task-id"]
    )
    with _http(cluster, ALICE) as alice, _http(cluster, None) as anonymous:
        _assert_refused(alice.get("/v1/config"), 403, "admin_key_required")
        _assert_refused(alice.get("/debug/timeline", params={"task": task_id}), 403, "admin_key_required")
        _assert_refused(anonymous.get("/v1/config"), 401, "missing_api_key")
        assert alice.get("/metrics").status_code == 200
    with _http(cluster, ADMIN) as admin:
        assert admin.get("/debug/timeline", params={"task": task_id}).status_code == 200
        config = admin.get("/v1/config")
        assert config.json()["api_keys"] == {"value": "<redacted: 2 values>", "source": "env SHOAL_API_KEYS"}
    for key in (ALICE, BOB, ADMIN):
        assert key not in config.text
        assert key not in cluster.up.tail(chars=10**7)  # nor in anything shoal up logged


def test_config_show_names_the_source_of_the_keys_but_not_the_keys(cluster: Cluster) -> None:
    shown = subprocess.run(
        shoal_argv("config", "show"), env=cluster.env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "env SHOAL_API_KEYS" in shown and ALICE not in shown and BOB not in shown


def test_cors_preflight_is_answered_for_the_configured_origin_only(cluster: Cluster) -> None:
    asks = {"access-control-request-method": "POST", "access-control-request-headers": "authorization,content-type"}
    with _http(cluster, None) as http:
        allowed = http.options("/v1/chat/completions", headers={"origin": APP_ORIGIN, **asks})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == APP_ORIGIN
        refused = http.options("/v1/chat/completions", headers={"origin": "http://evil.example", **asks})
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
        assert refused.json()["error"]["code"] == "cors_origin_not_allowed"
    with _http(cluster, BOB) as bob:
        answered = bob.get("/v1/models", headers={"origin": APP_ORIGIN})
        assert answered.headers["access-control-allow-origin"] == APP_ORIGIN


@pytest.mark.parametrize("command", ["up", "api"])
def test_a_network_bind_without_keys_is_refused_at_start_up(tmp_path: Path, command: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")}
    env |= {"SHOAL_DATA_DIR": str(tmp_path / "data"), "SHOAL_API_HOST": "0.0.0.0"}
    refused = subprocess.run(shoal_argv(command), env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0
    assert f"shoal {command}: invalid setting api_host='0.0.0.0' (from env SHOAL_API_HOST)" in refused.stderr
    assert "needs keys (set api_keys / SHOAL_API_KEYS, or api_keys_file)" in refused.stderr
    assert not (tmp_path / "data" / "nats").exists()  # refused before anything started
