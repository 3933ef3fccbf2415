"""The fault tests' checker, on hand-made cases: it must catch each way a cluster can break its
guarantees (a checker that cannot fail would prove nothing)."""

from __future__ import annotations

import pytest

from bench.netclient import ClientCall
from tests.netns.checker import LogTask, violations


def done(text: str) -> LogTask:
    return LogTask(created=True, chunks={0: text[:2], 2: text[2:]}, ended="completed", assignments=1)


def test_a_completed_task_streamed_whole_and_a_diagnosed_failure_pass() -> None:
    calls = [
        ClientCall(task_id="t1", text="hello", outcome="completed"),
        ClientCall(task_id="t2", text="he", outcome="failed", error="node w1 timed out"),
        ClientCall(outcome="refused", status=503),
    ]
    failed = LogTask(created=True, chunks={0: "he", 2: "llo"}, ended="failed", failed="node w1 timed out")
    assert violations(calls, {"t1": done("hello"), "t2": failed}) == []


def test_a_late_terminal_event_after_the_first_is_the_race_the_fold_ignores() -> None:
    late = LogTask(created=True, chunks={0: "hel"}, ended="failed", failed="instance retired")  # then completed
    assert violations([ClientCall(task_id="t", text="", outcome="failed", error="x")], {"t": late}) == []


@pytest.mark.parametrize(
    ("call", "task", "says"),
    [
        (ClientCall(task_id="t", text="hel", outcome="completed"), done("hello"), "!= streamed text"),
        (ClientCall(task_id="t", text="hello", outcome="completed"), None, "no TaskCreated"),
        (ClientCall(task_id="t", text="hello", outcome="hung"), done("hello"), "hung"),
        (ClientCall(task_id="t", text="", outcome="completed"), LogTask(created=True), "neither completed nor failed"),
        (ClientCall(task_id="t", outcome="failed"), LogTask(created=True, ended="failed"), "without a diagnosis"),
        (ClientCall(task_id="t", text="hello", outcome="failed"), done("hello"), "the client saw failed"),
        (
            ClientCall(task_id="t", text="hello", outcome="completed"),
            LogTask(created=True, chunks={0: "hello"}, ended="completed", assignments=2),
            "assigned 2 times",
        ),
        (
            ClientCall(task_id="t", text="hex", outcome="failed", error="e"),
            LogTask(created=True, chunks={0: "hello"}, ended="failed", failed="e"),
            "not a prefix",
        ),
        (ClientCall(text="", outcome="broken", error="reset"), None, "no task id"),
    ],
)
def test_each_broken_guarantee_is_reported(call: ClientCall, task: LogTask | None, says: str) -> None:
    found = violations([call], {} if task is None else {"t": task})
    assert any(says in line for line in found), found
