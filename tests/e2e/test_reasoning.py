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
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=1, model=str(model))
    try:
        yield running.wait_ready()
    finally:
        running.stop()


@pytest.fixture(scope="module")
def model(cluster: Cluster) -> str:
    return cluster.env["SHOAL_MODEL"]


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
