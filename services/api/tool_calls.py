"""Tool calls in a completion's text, split from its content as the text streams in.

The calls are in the model's own format, read by its parser (`tool_parsers.py`: mlx-lm's, chosen
from the chat template as mlx-lm chooses, or shoal's `llama3_json`). A format's calls sit between
its start and end markers (`<tool_call>`…`</tool_call>`); Mistral's have no end marker (a call runs
to the end of the completion) and Llama 3's no start marker (a call is the whole answer: one that
begins with `{` or `<|python_tag|>` is held to the end, then read). A body its parser cannot read
is not a call: the model's text, as it wrote it, is content.

Text that might be the start of a call is held back until it is known not to be, so a streamed
client never sees half a marker as content. `max_calls` (Responses' `parallel_tool_calls: false`)
keeps the first calls and drops what the model writes after the last one kept.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from events.catalogue import TaskCreated, ToolCall
from runner.models.chat import template_tools
from services.api.tool_parsers import PYTHON_TAG, ToolParser

_ID_ALPHABET = string.ascii_letters + string.digits
# text: content, watching for a start marker; inside: a call's body; answer_start: whether the
# answer begins like a call (no start marker); whole_answer: it does, held; plain: content only;
# done: nothing more is released (finished, or `max_calls` reached)
_Phase = Literal["text", "inside", "answer_start", "whole_answer", "plain", "done"]


@dataclass(slots=True)
class Split:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list[ToolCall])


@dataclass(slots=True)
class ToolCallSplitter:
    """Feed the completion's text in pieces; each piece returns what can be released now."""

    parser: ToolParser
    call_id: Callable[[int], str]  # the id of the n-th call of this completion
    tools: Sequence[dict[str, Any]] = ()  # the offered tools, as templates and parsers read them
    max_calls: int | None = None  # None: as many as the model writes
    calls_made: int = 0
    _held: str = ""
    _phase: _Phase = "text"

    def __post_init__(self) -> None:
        if not self.parser.start:
            self._phase = "answer_start"

    def feed(self, text: str) -> Split:
        self._held += text
        out = Split()
        while True:
            match self._phase:
                case "done":
                    self._held = ""
                    return out
                case "whole_answer":
                    return out  # read at the end
                case "plain":
                    out.content += self._held
                    self._held = ""
                    return out
                case "answer_start":
                    if not self._answer_begun():
                        return out  # not yet known
                case "text":
                    if not self._before_call(out):
                        return out
                case "inside":
                    if not self.parser.end:
                        return out  # the call runs to the end of the completion
                    at = self._held.find(self.parser.end)
                    if at < 0:
                        return out
                    body, self._held = self._held[:at], self._held[at + len(self.parser.end) :]
                    self._read(body, self.parser.start + body + self.parser.end, out)

    def finish(self) -> Split:
        """What is still held is read: a call without an end marker, or content (an unfinished call
        included)."""
        out = Split()
        match self._phase:
            case "inside" if not self.parser.end:
                self._read(self._held, self.parser.start + self._held, out)
            case "whole_answer":
                self._read(self._held, self._held, out)
            case "inside":
                out.content += self.parser.start + self._held
            case "text" | "answer_start" | "plain":
                out.content += self._held
            case "done":
                pass
        self._held = ""
        self._phase = "done"
        return out

    def _before_call(self, out: Split) -> bool:
        """Release the text before a start marker; whether one was found (go on inside)."""
        at = self._held.find(self.parser.start)
        if at < 0:
            keep = _partial_marker(self._held, self.parser.start)
            out.content += self._held[: len(self._held) - keep]
            self._held = self._held[len(self._held) - keep :]
            return False
        out.content += self._held[:at]
        self._held = self._held[at + len(self.parser.start) :]
        self._phase = "inside"
        return True

    def _answer_begun(self) -> bool:
        """A format without a start marker: an answer that begins like a call is held whole, any
        other is content from here on. False: it has not begun far enough to tell."""
        begun = self._held.lstrip()
        if not begun or (len(begun) < len(PYTHON_TAG) and PYTHON_TAG.startswith(begun)):
            return False
        self._phase = "whole_answer" if begun.startswith(("{", PYTHON_TAG)) else "plain"
        return True

    def _read(self, body: str, as_written: str, out: Split) -> None:
        calls = self.parser.calls(body, self.tools)
        if calls is None:  # not a call after all: the model's text, as it wrote it
            out.content += as_written
            self._phase = "text" if self.parser.start else "plain"
            return
        for call in calls:
            if self.max_calls is not None and self.calls_made >= self.max_calls:
                break
            out.calls.append(ToolCall(id=self.call_id(self.calls_made), name=call.name, arguments=call.arguments))
            self.calls_made += 1
        limited = self.max_calls is not None and self.calls_made >= self.max_calls
        self._phase = "done" if limited or not self.parser.start else "text"


def split_text(splitter: ToolCallSplitter, text: str) -> Split:
    """A whole completion's text at once."""
    head, tail = splitter.feed(text), splitter.finish()
    return Split(content=head.content + tail.content, calls=head.calls + tail.calls)


def task_call_splitter(
    task: TaskCreated, parser: ToolParser, id_prefix: str, max_calls: int | None
) -> ToolCallSplitter:
    """The splitter of the calls in `task`'s answer, given the tools it offered."""
    return ToolCallSplitter(
        parser=parser,
        call_id=call_ids(id_prefix, str(task.task_id), parser),
        tools=template_tools(task.params.tools),
        max_calls=max_calls,
    )


def call_ids(prefix: str, task_id: str, parser: ToolParser) -> Callable[[int], str]:
    """The ids of a task's calls: `<prefix><task id>_<n>`, or, for a format whose templates take
    only 9 letters and digits (Mistral's), 9 drawn from the same (so they are as unique)."""
    if not parser.short_ids:
        return lambda n: f"{prefix}{task_id}_{n}"
    return lambda n: _short_id(f"{task_id}_{n}")


def _short_id(seed: str) -> str:
    number = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big")
    letters: list[str] = []
    for _ in range(9):
        number, digit = divmod(number, len(_ID_ALPHABET))
        letters.append(_ID_ALPHABET[digit])
    return "".join(letters)


def _partial_marker(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
