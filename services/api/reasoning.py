"""A thinking model's reasoning, split from its answer as the text streams in (pure: no I/O).

Which markers a model thinks between is read from its tokenizer, as mlx-lm's tokenizer wrapper
reads them (`_infer_thinking`: a start and an end token both in the vocabulary; mlx-lm cannot be
imported here, it imports MLX): `<think>`…`</think>` (Qwen3, DeepSeek-R1, ...) and the others it
knows as single tokens. A chat template whose generation prompt already opens the block (Qwen3's
thinking-only models, DeepSeek-R1's) starts the completion inside it: its text is reasoning until
the end marker. Otherwise reasoning is a block the completion opens first (whitespace before it
allowed); a completion that starts with anything else has no reasoning, and a start marker later
in it is content. Only the first block is reasoning: what follows its end is the answer, the
whitespace the model puts after the end marker dropped.

Text that might be the start of a marker is held back until it is known not to be, so a streamed
client never sees half a marker in either part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jinja2.exceptions import TemplateError

# mlx-lm's single-token pairs, in its order (`mlx_lm.tokenizer_utils._infer_thinking`)
THINK_MARKERS = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"), ("<|think:start|>", "<|think:end|>"))


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


def thinking_switch_of(effort: ReasoningEffort | None) -> bool | None:
    """`reasoning_effort` as the only control a chat template gives: Qwen3's `enable_thinking`
    switch. "none" turns thinking off; any other effort turns it on (a template has no levels);
    none given leaves the template's default. A model without the switch refuses it (`admit`)."""
    if effort is None:
        return None
    return effort != "none"


@dataclass(frozen=True, slots=True)
class ReasoningMarkers:
    start: str
    end: str
    opened_by_prompt: bool  # the generation prompt ends inside the block: the completion begins there


def reasoning_markers(vocab: Mapping[str, int], generation_prompt: str) -> ReasoningMarkers | None:
    """The markers of a tokenizer whose vocabulary has a pair, else None (no reasoning to split)."""
    for start, end in THINK_MARKERS:
        if start in vocab and end in vocab:
            opened = generation_prompt.rstrip().endswith(start)
            return ReasoningMarkers(start=start, end=end, opened_by_prompt=opened)
    return None


def markers_of(tokenizer: Any) -> ReasoningMarkers | None:
    """`reasoning_markers` of a transformers tokenizer, its generation prompt rendered by its chat
    template (none: a prompt that opens nothing)."""
    vocab: Mapping[str, int] = tokenizer.get_vocab()
    prompt = ""
    if getattr(tokenizer, "chat_template", None):
        try:
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
            )
        except TemplateError:  # a template that wants more than one user message: it opens nothing we can see
            rendered = ""
        prompt = rendered if isinstance(rendered, str) else ""
    return reasoning_markers(vocab, prompt)


def has_thinking_switch(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads `enable_thinking` (Qwen3's switch; mlx-lm's
    server passes the same keyword)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "enable_thinking" in template


@dataclass(slots=True)
class ReasoningSplit:
    reasoning: str = ""
    content: str = ""


_State = Literal["before", "inside", "ending", "after"]  # ending: past the end marker, dropping whitespace


@dataclass(slots=True)
class ReasoningSplitter:
    """Feed the completion's text in pieces; each piece returns what can be released now."""

    markers: ReasoningMarkers
    _state: _State = "before"
    _held: str = ""

    def __post_init__(self) -> None:
        if self.markers.opened_by_prompt:
            self._state = "inside"

    def feed(self, text: str) -> ReasoningSplit:
        self._held += text
        out = ReasoningSplit()
        while self._held:
            match self._state:
                case "before":
                    stripped = self._held.lstrip()
                    start = self.markers.start
                    if stripped.startswith(start):
                        self._held, self._state = stripped[len(start) :], "inside"
                    elif start.startswith(stripped):
                        return out  # whitespace, or the marker's beginning: not known yet
                    else:
                        self._state = "after"
                case "inside":
                    end = self.markers.end
                    at = self._held.find(end)
                    if at < 0:
                        keep = _partial_marker(self._held, end)
                        out.reasoning += self._held[: len(self._held) - keep]
                        self._held = self._held[len(self._held) - keep :]
                        return out
                    out.reasoning += self._held[:at]
                    self._held, self._state = self._held[at + len(end) :], "ending"
                case "ending":
                    self._held = self._held.lstrip()
                    if self._held:
                        self._state = "after"
                case "after":
                    out.content += self._held
                    self._held = ""
        return out

    def finish(self) -> ReasoningSplit:
        """What is still held: reasoning cut short inside its block, else content."""
        held, self._held = self._held, ""
        if self._state == "inside":
            return ReasoningSplit(reasoning=held)
        return ReasoningSplit(content=held if self._state != "ending" else "")


def split_reasoning(markers: ReasoningMarkers, text: str) -> ReasoningSplit:
    """A whole completion's text at once."""
    splitter = ReasoningSplitter(markers)
    head, tail = splitter.feed(text), splitter.finish()
    return ReasoningSplit(reasoning=head.reasoning + tail.reasoning, content=head.content + tail.content)


def _partial_marker(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
