"""`n` > 1 on chat and text completions through the official openai client, against a live
`shoal up` of 2 workers (the tiny model split over 2 ranks): every choice under its index with its
own finish, usage counting the prompt once and every choice's tokens, each choice reproducible from
the seed, streamed as answered; one prefill of the prompt for all choices (the log's `PrefillStarted`
of each rank, counted), the log's chunks whole for every choice (the delivery checker); a client
that goes away ends every choice; hostile values of `n` are 400s in OpenAI's error shape, and the
next ordinary request is served by the same runners."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from eventlog.export import read_export
from events.catalogue import PrefillStarted
from services.ops.delivery import delivery_problems
from services.ops.scan import scan
from tests.e2e.cluster import Cluster, Proc, shoal_argv
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.helpers import wait_task_ended

pytestmark = pytest.mark.timeout(300)
PROMPT = "Tell me about the river stones"
MESSAGES: Any = [{"role": "user", "content": PROMPT}]
MAX_CHOICES = 4  # the cluster's max_choices


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {**E2E_SETTINGS, "max_choices": str(MAX_CHOICES)}
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=2, env=None, **settings)
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def streamed_chat(client: openai.OpenAI, **kwargs: Any) -> tuple[dict[int, str], dict[int, str], list[Any], str]:
    """Each choice's text and finish by index, the usage chunks, the task id."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usages: list[Any] = []
    with client.chat.completions.with_streaming_response.create(
        model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **kwargs
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        for chunk in response.parse():
            if chunk.usage is not None:
                usages.append(chunk.usage)
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
                if choice.finish_reason is not None:
                    assert choice.index not in finishes, "one finish per choice"
                    finishes[choice.index] = choice.finish_reason
    return texts, finishes, usages, task_id


def test_chat_choices_streamed_and_not(cluster: Cluster) -> None:
    client = cluster.client()
    one = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0, seed=9)
    several = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=1.0, seed=9, n=3, logprobs=True
    )
    assert [c.index for c in several.choices] == [0, 1, 2]
    texts = [c.message.content for c in several.choices]
    assert texts[0] == one.choices[0].message.content  # choice 0 is the seed's n=1 draw
    assert len(set(texts)) == 3, texts  # each choice its own seed stream
    assert all(c.finish_reason in ("stop", "length") for c in several.choices)
    usage, alone = several.usage, one.usage
    assert usage is not None and alone is not None
    assert usage.prompt_tokens == alone.prompt_tokens  # the prompt counted once
    tokens = [len(c.logprobs.content or []) for c in several.choices if c.logprobs is not None]
    assert usage.completion_tokens == sum(tokens) and len(tokens) == 3  # every choice's tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    streamed, finishes, usages, _ = streamed_chat(client, max_tokens=12, temperature=1.0, seed=9, n=3)
    assert streamed == dict(enumerate(texts))  # reproducible from the seed, streamed as answered
    assert finishes == {c.index: c.finish_reason for c in several.choices}
    assert len(usages) == 1 and usages[0].completion_tokens == usage.completion_tokens
    greedy = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content  # temperature 0: one answer


def test_text_completion_choices_streamed_and_not(cluster: Cluster) -> None:
    client = cluster.client()
    answered = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, temperature=1.0, seed=3, n=2)
    assert [c.index for c in answered.choices] == [0, 1]
    assert answered.choices[0].text != answered.choices[1].text
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=10, temperature=1.0, seed=3, n=2, stream=True, echo=True
    ):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert texts == {c.index: PROMPT + c.text for c in answered.choices}  # each choice echoes the prompt
    assert finishes == {c.index: c.finish_reason for c in answered.choices}


def test_one_prefill_for_every_choice_and_each_choice_whole_in_the_log(cluster: Cluster) -> None:
    client = cluster.client()
    texts, _, _, task_id = streamed_chat(client, max_tokens=10, temperature=1.0, seed=4, n=MAX_CHOICES)
    assert len(texts) == MAX_CHOICES
    records = export(cluster)
    events = [(r.seq, r.event) for r in records if r.stream == "events"]
    started = [e for _, e in events if isinstance(e, PrefillStarted) and e.task_id == task_id]
    assert sorted(e.rank for e in started) == [0, 1]  # once per rank: one prefill of the prompt
    state = scan(enumerate(records, 1)).state
    assert delivery_problems(events, state, {task_id: texts[0]}) == []


def test_a_client_that_goes_away_ends_every_choice(cluster: Cluster) -> None:
    client = cluster.client()
    with client.chat.completions.with_streaming_response.create(
        model="tiny", messages=MESSAGES, stream=True, max_tokens=400, temperature=1.0, n=3
    ) as response:
        task_id = response.headers["x-shoal-task-id"]
        for chunk in response.parse():
            if any(c.delta.content for c in chunk.choices):
                break  # the response closes: the client went away
    with cluster.http() as http:
        ended = wait_task_ended(http, task_id)
    assert ended["status"] == "cancelled", ended
    ordinary = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    assert ordinary.choices[0].message.content


SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
HOSTILE: dict[str, tuple[str, dict[str, Any]]] = {
    "n 0": ("/v1/chat/completions", {"n": 0}),
    "n negative": ("/v1/chat/completions", {"n": -2}),
    "n over max_choices": ("/v1/chat/completions", {"n": MAX_CHOICES + 1}),
    "n over OpenAI's bound": ("/v1/chat/completions", {"n": 10_000}),
    "n not an integer": ("/v1/chat/completions", {"n": "2"}),
    "n true": ("/v1/chat/completions", {"n": True}),
    "n with a json schema": ("/v1/chat/completions", {"n": 2, "response_format": SCHEMA}),
    "n with a required tool call": ("/v1/chat/completions", {"n": 2, "tools": [TOOL], "tool_choice": "required"}),
    "completions n 0": ("/v1/completions", {"n": 0}),
    "completions n over max_choices": ("/v1/completions", {"n": MAX_CHOICES + 1}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_n_is_a_400_in_openais_shape_and_the_next_request_is_served(cluster: Cluster, name: str) -> None:
    route, fields = HOSTILE[name]
    body = {"model": "tiny", "max_tokens": 4, **fields}
    body |= {"messages": MESSAGES} if route.endswith("chat/completions") else {"prompt": PROMPT}
    with cluster.http() as http:
        refused = http.post(route, json=body)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == "n", error
        ordinary = http.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4})
        assert ordinary.status_code == 200, ordinary.text


def export(cluster: Cluster) -> list[Any]:
    out = cluster.root / "export.jsonl"
    env = {**cluster.env, "SHOAL_NATS_URL": cluster.nats_url}
    assert Proc("export", shoal_argv("events", "export", "-o", str(out)), env, cluster.root).process.wait(60) == 0
    assert all(json.loads(line) for line in out.read_text().splitlines() if line)
    return list(read_export(out))
