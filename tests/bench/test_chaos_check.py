"""The checker of a chaos run's history, on hand-made histories: a clean one passes, and each
history that breaks one rule is reported for it (a checker that cannot fail would prove nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from bench.chaos_check import ClientRecord, FaultWindow, Recovery, Run, fold_history, violations
from events.catalogue import LogEvent, NodeTimedOut, Origin, TaskCompleted, TaskFailed
from events.ids import NodeId, TaskId
from tests.events.builders import Events

WORKERS = ("n1", "n2")


@dataclass
class Case:
    """A history under construction: the log's events and the clients' records."""

    ev: Events = field(default_factory=Events)
    log: list[LogEvent | None] = field(default_factory=list)
    calls: list[ClientRecord] = field(default_factory=list)
    faults: list[FaultWindow] = field(default_factory=list)
    recovery: Recovery = field(default_factory=lambda: Recovery(bound=60, nodes_up_after=5.0, served_after=8.0))
    exits: list[str] = field(default_factory=list)
    diagnosed: set[str] = field(default_factory=set)
    seqs: list[int] | None = None

    def completed(self, task: str, text: str = "hello", *, finish: str = "stop") -> None:
        ev = self.ev
        self.log += [ev.created(task), ev.assigned(task), ev.chunk(task, 0, text[:2]), ev.chunk(task, 2, text[2:])]
        self.log.append(TaskCompleted(env=ev.task_rank(task).stamp(), task_id=TaskId(task), finish_reason=finish))  # pyright: ignore[reportArgumentType]

    def failed(self, task: str, error: str = "node n2 timed out") -> None:
        ev = self.ev
        self.log += [ev.created(task), ev.assigned(task), ev.chunk(task, 0, "he")]
        self.log.append(TaskFailed(env=ev.master.stamp(), task_id=TaskId(task), error=error))
        self.diagnosed.add(task)

    def call(self, task: str, outcome: str, text: str = "", **more: object) -> None:
        number = len(self.calls)
        record = ClientRecord(number=number, kind="stream", key=0, started=10.0 * number, ended=10.0 * number + 2)
        record.bound, record.task_id, record.text, record.outcome = 30.0, task, text, outcome  # pyright: ignore[reportAttributeAccessIssue]
        for name, value in more.items():
            setattr(record, name, value)
        self.calls.append(record)

    def run(self) -> Run:
        seqs = self.seqs or list(range(1, len(self.log) + 1))
        return Run(
            history=fold_history(zip(seqs, self.log, strict=True)),
            calls=self.calls,
            faults=self.faults,
            recovery=self.recovery,
            workers=WORKERS,
            base_bound=30.0,
            fault_grace=12.0,
            exits=self.exits,
            diagnosed=frozenset(self.diagnosed),
        )


def clean() -> Case:
    """Nodes up, one instance across both; a completed, a failed, a cancelled and a refused request."""
    case = Case()
    ev = case.ev
    case.log += [ev.node("n1"), ev.node("n2"), ev.placed("i1", WORKERS)]
    case.completed("t1")
    case.call("t1", "completed", "hello")
    case.failed("t2")
    case.call("t2", "failed", "he", error="node n2 timed out")
    case.completed("t3", "hel", finish="cancelled")
    case.call("t3", "cancelled", "h")
    case.call("", "refused", status=503, error="the event log is unavailable: no space left on the NATS store")
    return case


def test_a_clean_history_has_no_violation() -> None:
    assert violations(clean().run()) == []


def test_a_call_cut_off_while_a_fault_hit_the_api_is_explained() -> None:
    case = clean()
    case.completed("t4")
    case.call("t4", "broken", "he", error="RemoteProtocolError")
    case.faults.append(FaultWindow("kill", "api", case.calls[-1].started + 1, case.calls[-1].ended + 5))
    assert violations(case.run()) == []


def test_a_stream_its_client_gave_up_on_as_silent_while_a_fault_hit_the_api_is_its_clients_verdict() -> None:
    """Not a lost task nor a hang: the task ends on the log as it may (completed here), and the
    client's text is a prefix of it."""
    case = clean()
    case.completed("t4")
    case.call("t4", "silent", "he", error="connection silent for 50s (not even a keepalive)")
    case.faults.append(FaultWindow("partition_host", "control", case.calls[-1].started + 1, case.calls[-1].ended + 60))
    assert violations(case.run()) == []


def test_each_fault_while_a_call_ran_extends_its_bound_by_its_length_and_a_grace() -> None:
    case = clean()
    call = case.calls[0]
    call.ended = call.started + 30 + 10 + 12  # the base, one fault of 10 s, and its grace
    case.faults.append(FaultWindow("partition_majority", "nats1", call.started + 1, call.started + 11, "nats2"))
    assert violations(case.run()) == []
    call.ended += 1
    assert any("past its bound 52s" in line for line in violations(case.run()))


def _edit(case: Case, index: int, **changes: object) -> None:
    event = case.log[index]
    assert event is not None
    case.log[index] = msgspec.structs.replace(event, **changes)


def _break_text(case: Case) -> None:
    case.calls[0].text = "hellx"


def _lose_created(case: Case) -> None:
    case.log[3] = None  # the first task's TaskCreated became a malformed message
    case.log = [e for i, e in enumerate(case.log) if i != 3]


def _never_end(case: Case) -> None:
    case.log += [case.ev.created("t9"), case.ev.assigned("t9")]


def _assign_twice(case: Case) -> None:
    case.log.append(case.ev.assigned("t1", "i2"))


def _chunk_twice(case: Case) -> None:
    case.log.append(case.ev.chunk("t1", 0, "he"))


def _chunk_from_a_stranger(case: Case) -> None:
    stranger = case.ev.stamper(Origin(service="runner", node="n7", rank=1))
    case.log.append(msgspec.structs.replace(case.ev.chunk("t1", 5, ""), env=stranger.stamp()))


def _fail_silently(case: Case) -> None:
    index = next(i for i, e in enumerate(case.log) if isinstance(e, TaskFailed))
    _edit(case, index, error=" ")


def _undiagnosed(case: Case) -> None:
    case.diagnosed.clear()


def _client_told_nothing(case: Case) -> None:
    case.calls[1].error = ""


def _client_saw_failed_but_completed(case: Case) -> None:
    case.calls[0].outcome, case.calls[0].error = "failed", "boom"


def _client_saw_complete_but_failed(case: Case) -> None:
    case.calls[1].outcome = "completed"


def _not_a_prefix(case: Case) -> None:
    case.calls[2].text = "x"


def _too_long(case: Case) -> None:
    case.calls[0].ended = case.calls[0].started + 31


def _hung(case: Case) -> None:
    case.calls[0].outcome = "hung"


def _cut_off_without_fault(case: Case) -> None:
    case.calls[0].outcome, case.calls[0].text = "broken", "he"


def _silent_without_fault(case: Case) -> None:
    case.calls[0].outcome, case.calls[0].text = "silent", "he"


def _silent_with_text_not_the_logs(case: Case) -> None:
    case.calls[0].outcome, case.calls[0].text = "silent", "hx"
    case.faults.append(FaultWindow("kill", "api", case.calls[0].started, case.calls[0].ended))


def _refused_for_the_client(case: Case) -> None:
    case.calls[3].status = 400


def _refused_without_reason(case: Case) -> None:
    case.calls[3].error = ""


def _hole(case: Case) -> None:
    case.seqs = [*range(1, 6), *range(7, len(case.log) + 2)]


def _malformed(case: Case) -> None:
    case.log.append(None)


def _exit(case: Case) -> None:
    case.exits.append("w1 (exit code 1)")


def _node_left_down(case: Case) -> None:
    case.log.append(NodeTimedOut(env=case.ev.master.stamp(), node_id=NodeId("n2"), last_seen=0))


def _slow_recovery(case: Case) -> None:
    case.recovery = Recovery(bound=60, nodes_up_after=61.0, served_after=8.0)


def _never_served(case: Case) -> None:
    case.recovery = Recovery(bound=60, nodes_up_after=5.0, served_after=None)


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (_break_text, "the log's text 'hello' != the client's 'hellx'"),
        (_lose_created, "no TaskCreated"),
        (_never_end, "task t9: never ended"),
        (_assign_twice, "assigned 2 times"),
        (_chunk_twice, "chunk index(es) on the log twice"),
        (_chunk_from_a_stranger, "outside its instance i1"),
        (_fail_silently, "failed without a reason"),
        (_undiagnosed, "`shoal diagnose` has no finding"),
        (_client_told_nothing, "told it failed, with no reason"),
        (_client_saw_failed_but_completed, "completed on the log, but its client was told it failed"),
        (_client_saw_complete_but_failed, "its client saw it complete, the log says failed"),
        (_not_a_prefix, "not a prefix"),
        (_too_long, "past its bound"),
        (_hung, "past its bound"),
        (_cut_off_without_fault, "cut off with no fault on the API"),
        (_silent_without_fault, "went silent with no fault on the API"),
        (_silent_with_text_not_the_logs, "its client got 'hx', not a prefix of the log's 'hello'"),
        (_refused_for_the_client, "not a server-side refusal"),
        (_refused_without_reason, "no reason"),
        (_hole, "a hole in the log: seq 5 is followed by 7"),
        (_malformed, "no event: seq"),
        (_exit, "service w1 (exit code 1) exited by itself"),
        (_node_left_down, "node n2 is not up at the end of the log"),
        (_slow_recovery, "every node up at /healthz after 61.0s after the last heal"),
        (_never_served, "a request served never after the last heal"),
    ],
)
def test_each_broken_rule_is_reported(breaks: Callable[[Case], None], says: str) -> None:
    case = clean()
    breaks(case)
    found = violations(case.run())
    assert any(says in line for line in found), found


def test_a_task_that_never_ended_points_at_its_ranks_stderr_files() -> None:
    case = clean()
    case.log[1] = msgspec.structs.replace(case.ev.node("n2"), runner_logs="/data/runner-logs/n2")
    _never_end(case)
    found = [line for line in violations(case.run()) if "t9" in line]
    assert found == [
        "task t9: never ended on the log (neither completed, cancelled nor failed); "
        "its ranks' stderr: /data/runner-logs/n2/i1.rank1.log"
    ]
