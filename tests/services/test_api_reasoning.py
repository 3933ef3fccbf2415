"""A thinking model's reasoning split from its answer: table cases, and any chunking of a
completion splits as the whole text does."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.api.reasoning import ReasoningMarkers, ReasoningSplitter, reasoning_markers, split_reasoning

OPENS_ITSELF = ReasoningMarkers(start="<think>", end="</think>", opened_by_prompt=False)
OPENED = ReasoningMarkers(start="<think>", end="</think>", opened_by_prompt=True)


@pytest.mark.parametrize(
    ("markers", "text", "reasoning", "content"),
    [
        (OPENS_ITSELF, "<think>hmm</think>\n\nHello", "hmm", "Hello"),
        (OPENS_ITSELF, "\n<think>\nhmm\n</think>Hello", "\nhmm\n", "Hello"),
        (OPENS_ITSELF, "Hello <think>x</think>", "", "Hello <think>x</think>"),
        (OPENS_ITSELF, "<think>cut short", "cut short", ""),
        (OPENS_ITSELF, "<think>a</think>b</think>c", "a", "b</think>c"),
        (OPENS_ITSELF, "<thin", "", "<thin"),
        (OPENS_ITSELF, "", "", ""),
        (OPENED, "hmm</think>\n\nHello", "hmm", "Hello"),
        (OPENED, "all of it is thought", "all of it is thought", ""),
        (OPENED, "a</thi", "a</thi", ""),
        (OPENED, "</think>", "", ""),
    ],
)
def test_reasoning_and_answer(markers: ReasoningMarkers, text: str, reasoning: str, content: str) -> None:
    split = split_reasoning(markers, text)
    assert (split.reasoning, split.content) == (reasoning, content)


PIECES = st.lists(st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", "\n", " ", "a", "b c", "<th"]))


@given(pieces=PIECES, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8), opened=st.booleans())
def test_any_chunking_splits_as_the_whole_text(pieces: list[str], cuts: list[int], opened: bool) -> None:
    markers = OPENED if opened else OPENS_ITSELF
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    splitter = ReasoningSplitter(markers)
    reasoning = content = ""
    for start, end in pairwise(bounds):
        part = splitter.feed(text[start:end])
        reasoning, content = reasoning + part.reasoning, content + part.content
    tail = splitter.finish()
    whole = split_reasoning(markers, text)
    assert (reasoning + tail.reasoning, content + tail.content) == (whole.reasoning, whole.content)


def test_markers_come_from_the_vocabulary_and_the_generation_prompt() -> None:
    vocab = {"<think>": 5, "</think>": 6}
    assert reasoning_markers({"a": 1}, "<|im_start|>assistant\n") is None
    assert reasoning_markers(vocab, "<|im_start|>assistant\n") == OPENS_ITSELF
    assert reasoning_markers(vocab, "<|im_start|>assistant\n<think>\n") == OPENED
