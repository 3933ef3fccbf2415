"""Tool calls in a completion's text, split from its content as the text streams in.

The calls are in the `json_tools` format of mlx-lm (`<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`, Hermes and Qwen 2.5 templates, the tiny model's), which shoal's grammar forces for
`tool_choice` "required" or named; each body is read as mlx-lm's `json_tools` parser reads it (JSON).
mlx-lm's parser modules cannot be imported here (the `mlx_lm` package imports MLX, which only
runners load), so a model with another format gets its markup back as content.

Text that might be the start of a call is held back until it is known not to be, so a streamed
client never sees half a marker as content.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from events.catalogue import ToolCall
from runner.models.grammar import TOOL_CALL_END, TOOL_CALL_START


@dataclass(slots=True)
class Split:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


@dataclass(slots=True)
class ToolCallSplitter:
    """Feed the completion's text in pieces; each piece returns what can be released now."""

    call_id: Callable[[int], str]  # the id of the n-th call of this completion
    calls_made: int = 0
    _held: str = ""
    _inside: bool = False

    def feed(self, text: str) -> Split:
        self._held += text
        out = Split()
        while True:
            marker = TOOL_CALL_END if self._inside else TOOL_CALL_START
            at = self._held.find(marker)
            if at < 0:
                if not self._inside:
                    keep = _partial_marker(self._held, TOOL_CALL_START)
                    out.content += self._held[: len(self._held) - keep]
                    self._held = self._held[len(self._held) - keep :]
                return out
            before, self._held = self._held[:at], self._held[at + len(marker) :]
            if not self._inside:
                out.content += before
            elif (call := self._parse(before)) is not None:
                out.calls.append(call)
            else:  # not a call after all: the model's text, as it wrote it
                out.content += TOOL_CALL_START + before + TOOL_CALL_END
            self._inside = not self._inside

    def finish(self) -> Split:
        """What is still held (an unfinished call included) is content."""
        rest = (TOOL_CALL_START if self._inside else "") + self._held
        self._held, self._inside = "", False
        return Split(content=rest)

    def _parse(self, body: str) -> ToolCall | None:
        try:
            call = json.loads(body.strip())
        except json.JSONDecodeError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):  # pyright: ignore[reportUnknownMemberType]
            return None
        arguments: object = call.get("arguments", {})  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))
        made = ToolCall(id=self.call_id(self.calls_made), name=str(call["name"]), arguments=text)  # pyright: ignore[reportUnknownArgumentType]
        self.calls_made += 1
        return made


def split_text(splitter: ToolCallSplitter, text: str) -> Split:
    """A whole completion's text at once."""
    head, tail = splitter.feed(text), splitter.finish()
    return Split(content=head.content + tail.content, calls=head.calls)


def _partial_marker(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
