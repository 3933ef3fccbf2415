"""A chat completion's text as its parts, as it streams in: a thinking model's reasoning first
(`reasoning.py`), then, in the answer, the tool calls of a task that offered tools
(`tool_calls.py`). Chat completions and responses both read a task's output through this."""

from __future__ import annotations

from dataclasses import dataclass, field

from events.catalogue import TaskCreated, ToolCall
from services.api.reasoning import ReasoningMarkers, ReasoningSplit, ReasoningSplitter
from services.api.tool_calls import Split, ToolCallSplitter, task_call_splitter
from services.api.tool_parsers import ToolParser


@dataclass(slots=True)
class OutputPiece:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list[ToolCall])


@dataclass(slots=True)
class OutputSplitter:
    """Feed the text in pieces; each returns what can be released now (text that may begin a
    marker is held back)."""

    reasoning: ReasoningSplitter | None
    tools: ToolCallSplitter | None

    @property
    def calls_made(self) -> int:
        return 0 if self.tools is None else self.tools.calls_made

    def feed(self, text: str) -> OutputPiece:
        thought = ReasoningSplit(content=text) if self.reasoning is None else self.reasoning.feed(text)
        return self._answer(thought, finish=False)

    def finish(self) -> OutputPiece:
        thought = ReasoningSplit() if self.reasoning is None else self.reasoning.finish()
        return self._answer(thought, finish=True)

    def _answer(self, thought: ReasoningSplit, *, finish: bool) -> OutputPiece:
        if self.tools is None:
            return OutputPiece(reasoning=thought.reasoning, content=thought.content)
        split = self.tools.feed(thought.content)
        if finish:
            tail = self.tools.finish()
            split = Split(content=split.content + tail.content, calls=split.calls + tail.calls)
        return OutputPiece(reasoning=thought.reasoning, content=split.content, calls=split.calls)


def output_splitter(
    task: TaskCreated,
    markers: ReasoningMarkers | None,
    parser: ToolParser | None,
    max_calls: int | None = None,
) -> OutputSplitter:
    """The splitter of `task`'s output: reasoning when the model thinks between `markers`, tool
    calls (read by `parser`, at most `max_calls`) only when the task offered the model tools."""
    tools = None if not task.params.tools or parser is None else task_call_splitter(task, parser, "call_", max_calls)
    return OutputSplitter(reasoning=None if markers is None else ReasoningSplitter(markers), tools=tools)


def split_output(splitter: OutputSplitter, text: str) -> OutputPiece:
    """A whole completion's text at once."""
    head, tail = splitter.feed(text), splitter.finish()
    return OutputPiece(
        reasoning=head.reasoning + tail.reasoning, content=head.content + tail.content, calls=head.calls + tail.calls
    )
