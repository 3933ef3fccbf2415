"""`/v1/completions`, logprobs and SSE keepalives through the official openai client, on 1 and 2
workers: the same greedy text as chat's engine would give a raw prompt, OpenAI's shapes parsed by
the client's own types, and keepalive comments that arrive before the first token."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.e2e.cluster import Cluster
from tests.e2e.conftest import E2E_SETTINGS
from tests.e2e.helpers import long_prompt

pytestmark = pytest.mark.timeout(240)

PROMPT = "The quick brown fox"
KEEPALIVE_SECONDS = "0.05"  # short: a prefill of a long prompt is many intervals, and every stream parses


@pytest.fixture(scope="module", params=[1, 2], ids=["1-worker", "2-workers"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    settings = {**E2E_SETTINGS, "sse_keepalive_seconds": KEEPALIVE_SECONDS}
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=request.param, env=None, **settings)
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def _streamed_text(client: openai.OpenAI, **kwargs: object) -> tuple[str, str | None, list[object]]:
    parts: list[str] = []
    finish: str | None = None
    usages: list[object] = []
    for chunk in client.completions.create(model="tiny", stream=True, **kwargs):  # pyright: ignore[reportCallIssue, reportArgumentType]
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            parts.append(choice.text)
            finish = choice.finish_reason or finish
    return "".join(parts), finish, usages


def test_completion_streaming_or_not_echo_and_usage(cluster: Cluster) -> None:
    client = cluster.client()
    completion = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10)
    text = completion.choices[0].text
    assert completion.object == "text_completion"
    assert completion.usage is not None and completion.usage.completion_tokens <= 10
    assert completion.choices[0].logprobs is None
    streamed, finish, usages = _streamed_text(
        client, prompt=PROMPT, max_tokens=10, stream_options={"include_usage": True}
    )
    assert streamed == text
    assert finish == completion.choices[0].finish_reason
    assert len(usages) == 1
    echoed = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, echo=True)
    assert echoed.choices[0].text == PROMPT + text
    streamed_echo, _, _ = _streamed_text(client, prompt=PROMPT, max_tokens=10, echo=True)
    assert streamed_echo == PROMPT + text


def test_token_id_prompt_is_the_text_prompt_encoded(cluster: Cluster) -> None:
    from transformers import AutoTokenizer

    from runner.models.tiny import cached_tiny

    ids = [int(i) for i in AutoTokenizer.from_pretrained(str(cached_tiny())).encode(PROMPT)]  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType, reportUnknownArgumentType]
    client = cluster.client()
    by_text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=8, echo=True)
    assert by_ids.choices[0].text.endswith(by_text.choices[0].text)
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError, match="one prompt per request"):
        client.completions.create(model="tiny", prompt=["one", "two"], max_tokens=4)


def test_stop_cuts_the_completion(cluster: Cluster) -> None:
    client = cluster.client()
    full = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16).choices[0].text
    assert len(full) >= 4
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_logit_bias_and_penalties_through_the_client(cluster: Cluster) -> None:
    """A +100 bias makes the greedy output one token repeated, with logprob 0 (the logprobs are of
    the adjusted distribution); a frequency penalty then breaks the repetition, streamed or not."""
    client = cluster.client()
    plain = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, logprobs=1)
    assert plain.choices[0].logprobs is not None and plain.choices[0].logprobs.tokens
    forced = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, logprobs=1, logit_bias={"42": 100})
    forced_logprobs = forced.choices[0].logprobs
    assert forced_logprobs is not None and forced_logprobs.tokens is not None
    assert len(set(forced_logprobs.tokens)) == 1 and forced.usage is not None and forced.usage.completion_tokens == 8
    assert forced_logprobs.token_logprobs == pytest.approx([0.0] * 8, abs=1e-3)
    assert forced.choices[0].text != plain.choices[0].text
    varied = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=8,
        logprobs=1,
        logit_bias={"42": 5},
        frequency_penalty=2,
        presence_penalty=2,
    )
    assert varied.choices[0].logprobs is not None and len(set(varied.choices[0].logprobs.tokens or [])) > 1
    streamed, _, _ = _streamed_text(
        client, prompt=PROMPT, max_tokens=8, logit_bias={"42": 5}, frequency_penalty=2, presence_penalty=2
    )
    assert streamed == varied.choices[0].text
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=4, logit_bias={"42": 100}
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 4


def test_top_k_and_min_p_reach_the_sampler(cluster: Cluster) -> None:
    """A hot draw (temperature 2) truncated to the likeliest token by top_k=1, or by min_p=1, is
    the greedy text, on chat and completions; the same seeded draw untruncated is not."""
    client = cluster.client()
    greedy = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    hot = {"model": "tiny", "prompt": PROMPT, "max_tokens": 16, "temperature": 2.0, "seed": 1}
    assert client.completions.create(**hot).choices[0].text != greedy.choices[0].text  # pyright: ignore[reportCallIssue, reportArgumentType]
    for extra in ({"top_k": 1}, {"min_p": 1.0}, {"top_k": 1, "min_p": 0.5}):
        truncated = client.completions.create(**hot, extra_body=extra)  # pyright: ignore[reportCallIssue, reportArgumentType]
        assert truncated.choices[0].text == greedy.choices[0].text, extra
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
    chat_greedy = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12)
    chat_top1 = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=2.0, extra_body={"top_k": 1}
    )
    assert chat_top1.choices[0].message.content == chat_greedy.choices[0].message.content


def test_completion_logprobs_in_the_legacy_shape(cluster: Cluster) -> None:
    client = cluster.client()
    completion = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, logprobs=3)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs and logprobs.top_logprobs
    assert "".join(logprobs.tokens).lstrip() == completion.choices[0].text.lstrip()
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 1 <= len(top) <= 3
        assert chosen == pytest.approx(max(top.values()), abs=1e-6)  # greedy
    streamed: list[float] = []
    for chunk in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.token_logprobs or []
    assert streamed == pytest.approx(logprobs.token_logprobs, abs=1e-6)


def test_chat_logprobs_streaming_or_not(cluster: Cluster) -> None:
    client = cluster.client()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
    asked = {"model": "tiny", "messages": messages, "max_tokens": 6, "logprobs": True, "top_logprobs": 4}
    completion = client.chat.completions.create(**asked)
    choice = completion.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    # mlx-lm's detokenizer drops the first token's leading space from the text; logprobs keep it
    assert "".join(t.token for t in content).lstrip() == (choice.message.content or "").lstrip()
    for token in content:
        tops = [t.logprob for t in token.top_logprobs]
        assert len(tops) == 4 and tops == sorted(tops, reverse=True)
        assert token.logprob <= 0 and token.logprob == pytest.approx(tops[0], abs=1e-6)
        assert token.bytes == list(token.token.encode())
    chunks = client.chat.completions.create(**asked, stream=True)
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content or []]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-6)
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
    assert plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2, top_logprobs=2)


def test_keepalive_comments_come_before_the_first_token(cluster: Cluster) -> None:
    body = {"model": "tiny", "prompt": long_prompt(600), "max_tokens": 3, "stream": True}
    lines: list[str] = []
    with (
        httpx.Client(base_url=cluster.base_url, timeout=120) as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data: "))
    assert lines[0] == ": keepalive" and first_data > 0
    assert all(line == ": keepalive" for line in lines[:first_data])
    assert lines[-1] == "data: [DONE]"
    # the official client skips the comments: a long streamed chat parses
    client = cluster.client()
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": long_prompt(600)}],
        max_tokens=3,
        stream=True,
    )
    assert [chunk.choices[0].finish_reason for chunk in stream if chunk.choices][-1] in ("stop", "length")
