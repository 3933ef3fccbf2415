"""A thinking model's reasoning apart from its answer, on a live cluster serving a tiny model with
Qwen3-Thinking-2507's tokens and chat template (its generation prompt opens `<think>`): the raw
completion of the same rendered prompt is the oracle, split as the markers say."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseReasoningTextDeltaEvent

from runner.models.tiny_families import make_tiny_family
from services.api.reasoning import ReasoningMarkers, split_reasoning
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

QUESTION = "Tell me about the river"
MARKERS = ReasoningMarkers(start="<think>", end="</think>", opened_by_prompt=True)
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model = make_tiny_family(tmp_path_factory.mktemp("models") / "qwen3-thinking", "qwen3-thinking")
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=1, models=str(model))
    try:
        yield running.wait_ready()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def model(cluster: Cluster) -> str:
    return cluster.env["SHOAL_MODELS"]


@pytest.fixture(scope="module")
def raw_text(cluster: Cluster, model: str) -> str:
    """The model's greedy text after the rendered chat prompt, unsplit (`/v1/completions`)."""
    prompt = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    completion = cluster.client().completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS)
    return completion.choices[0].text


def test_chat_puts_the_reasoning_in_reasoning_content(cluster: Cluster, model: str, raw_text: str) -> None:
    expected = split_reasoning(MARKERS, raw_text)
    assert expected.reasoning  # the prompt opened the block: the model's text begins inside it
    messages: Any = [{"role": "user", "content": QUESTION}]
    message: Any = (
        cluster.client()
        .chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS)
        .choices[0]
        .message
    )
    assert message.reasoning_content == expected.reasoning
    assert (message.content or "") == expected.content


def test_chat_streams_the_reasoning_apart(cluster: Cluster, model: str, raw_text: str) -> None:
    expected = split_reasoning(MARKERS, raw_text)
    messages: Any = [{"role": "user", "content": QUESTION}]
    reasoning: list[str] = []
    content: list[str] = []
    for chunk in cluster.client().chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, stream=True
    ):
        if chunk.choices:
            delta: Any = chunk.choices[0].delta
            reasoning.append(getattr(delta, "reasoning_content", None) or "")
            content.append(delta.content or "")
    assert ("".join(reasoning), "".join(content)) == (expected.reasoning, expected.content)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_responses_give_the_reasoning_its_own_item(cluster: Cluster, model: str, raw_text: str, stream: bool) -> None:
    expected = split_reasoning(MARKERS, raw_text)
    client: openai.OpenAI = cluster.client()
    if stream:
        events = list(client.responses.create(model=model, input=QUESTION, max_output_tokens=MAX_TOKENS, stream=True))
        deltas = "".join(e.delta for e in events if isinstance(e, ResponseReasoningTextDeltaEvent))
        assert deltas == expected.reasoning
        final: Any = events[-1]
        response = final.response
    else:
        response = client.responses.create(model=model, input=QUESTION, max_output_tokens=MAX_TOKENS)
    item = response.output[0]
    assert item.type == "reasoning"
    assert item.content is not None and item.content[0].text == expected.reasoning
    assert response.output_text == expected.content
    usage = response.usage
    assert usage is not None and 0 < usage.output_tokens_details.reasoning_tokens <= usage.output_tokens


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Qwen3's hybrid template: the model opens `<think>` itself; `enable_thinking=False` closes an
    empty block in the generation prompt."""
    model = make_tiny_family(tmp_path_factory.mktemp("models") / "qwen3", "qwen3")
    running = Cluster(tmp_path_factory.mktemp("hybrid"), workers=1, models=str(model))
    try:
        yield running.wait_ready()
    finally:
        running.stop()


def test_reasoning_effort_none_turns_the_templates_thinking_off(hybrid: Cluster) -> None:
    """The switch reaches the runner's template: reasoning_effort "none" is the raw completion of
    the prompt with the empty block Qwen3's template closes; another effort is the default prompt."""
    model, client = hybrid.env["SHOAL_MODELS"], hybrid.client()
    opened = f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    raw_off = client.completions.create(model=model, prompt=opened + "<think>\n\n</think>\n\n", max_tokens=MAX_TOKENS)
    raw_on = client.completions.create(model=model, prompt=opened, max_tokens=MAX_TOKENS)
    messages: Any = [{"role": "user", "content": QUESTION}]
    for effort, raw in (("none", raw_off), ("high", raw_on)):
        expected = split_reasoning(ReasoningMarkers("<think>", "</think>", opened_by_prompt=False), raw.choices[0].text)
        message: Any = (
            client.chat.completions.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, reasoning_effort=effort
            )
            .choices[0]
            .message
        )
        assert (message.content or "", message.reasoning_content or "") == (expected.content, expected.reasoning)


def test_reasoning_effort_is_refused_by_a_template_without_the_switch(cluster: Cluster, model: str) -> None:
    """Qwen3-Thinking-2507's template always thinks: it has no switch to turn."""
    with pytest.raises(openai.BadRequestError, match="no thinking switch"):
        cluster.client().chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, reasoning_effort="none"
        )
