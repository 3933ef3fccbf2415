"""Did every completed task reach the log whole? The check the fault tests end with.

A task the log calls completed must carry its whole text: its `ChunkGenerated`s cover its tokens
from 0 with no gap and no repeat (`index` is the chunk's first token), none comes after the
`TaskCompleted` (the fold would ignore it, so the text would silently lack it), their
concatenation is the folded text and the `TaskCompleted`'s token count, and it is what the
client's stream delivered. A task of several completions (`TaskParams.n`) is checked choice by
choice: each choice's chunks cover its own tokens (`TaskCompleted.choices` counts them), the folded
and delivered texts are choice 0's. Pure: it reads (seq, event) pairs in log order and what clients got.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from events.catalogue import AnyEvent, ChunkGenerated, TaskCompleted, TaskFailed
from events.ids import TaskId
from events.state import State


class _Task:
    def __init__(self) -> None:
        self.text: dict[int, list[str]] = {}  # by choice
        self.tokens: dict[int, int] = {}  # by choice: the next token due
        self.problems: list[str] = []
        self.ended: TaskCompleted | TaskFailed | None = None


def delivery_problems(
    events: Iterable[tuple[int, AnyEvent]], state: State, delivered: Mapping[str, str] | None = None
) -> list[str]:
    """What is wrong with the completed tasks of `events` (the log in order, `state` its fold);
    `delivered`: the text each client's stream received, by task id (tasks absent are not
    compared). Empty when every completed task is whole."""
    tasks: dict[TaskId, _Task] = {}
    for seq, event in events:
        if isinstance(event, ChunkGenerated):
            _chunk(tasks.setdefault(event.task_id, _Task()), seq, event)
        elif isinstance(event, TaskCompleted | TaskFailed):
            task = tasks.setdefault(event.task_id, _Task())
            task.ended = task.ended or event
    problems: list[str] = []
    for task_id, task in tasks.items():
        if not isinstance(task.ended, TaskCompleted) or task.ended.finish_reason == "cancelled":
            continue
        problems += [f"task {task_id}: {problem}" for problem in _whole(task, task.ended, state, delivered, task_id)]
    return problems


def _chunk(task: _Task, seq: int, chunk: ChunkGenerated) -> None:
    where = f"chunk at token {chunk.index}" + (f" of choice {chunk.choice}" if chunk.choice else "")
    if task.ended is not None:
        task.problems.append(f"{where} (seq {seq}) came after the task ended")
        return
    due = task.tokens.get(chunk.choice, 0)
    if chunk.index != due:
        task.problems.append(f"{where} (seq {seq}) where token {due} was due")
    task.text.setdefault(chunk.choice, []).append(chunk.text)
    task.tokens[chunk.choice] = chunk.index + len(chunk.token_ids)


def _whole(
    task: _Task, completed: TaskCompleted, state: State, delivered: Mapping[str, str] | None, task_id: TaskId
) -> list[str]:
    problems = list(task.problems)
    text = "".join(task.text.get(0, []))
    held = sum(task.tokens.values())
    if completed.usage.completion_tokens != held:
        problems.append(f"completed with {completed.usage.completion_tokens} tokens, its chunks hold {held}")
    for choice in completed.choices:
        if choice.completion_tokens != task.tokens.get(choice.index, 0):
            problems.append(
                f"choice {choice.index} completed with {choice.completion_tokens} tokens, "
                f"its chunks hold {task.tokens.get(choice.index, 0)}"
            )
    folded = state.tasks.get(task_id)
    if folded is not None and folded.text != text:
        problems.append(f"the folded text {folded.text!r} is not its chunks' {text!r}")
    if delivered is not None and task_id in delivered and delivered[task_id] != text:
        problems.append(f"the client received {delivered[task_id]!r}, the log holds {text!r}")
    return problems
