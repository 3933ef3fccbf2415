"""The shared vocabulary says what the code really does, and old logs still decode under it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import msgspec
import pytest

from events.catalogue import AnyEvent, RunnerHeartbeat, RunnerStatusChanged
from events.vocabulary import Phase, RetiredPhase
from runner.service.exit_codes import PEER_LOST_EXIT, exit_cause

RUNNER = Path(__file__).resolve().parents[2] / "runner"


def phases_entered() -> set[str]:
    """Every phase literal passed to `<tracker>.enter(...)` anywhere under runner/."""
    entered: set[str] = set()
    for path in RUNNER.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "enter"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                entered.add(node.args[0].value)
    return entered


def test_every_phase_is_one_the_runner_enters() -> None:
    # "idle" is also where a PhaseTracker starts, before any enter(); retired phases decode old logs.
    assert phases_entered() == set(get_args(Phase)) - set(get_args(RetiredPhase))


@pytest.mark.parametrize(
    ("code", "cause"), [(PEER_LOST_EXIT, "peer_lost"), (-9, "killed"), (-15, "killed"), (1, "exited"), (0, "exited")]
)
def test_the_worker_reads_a_cause_from_the_exit_status(code: int, cause: str) -> None:
    assert exit_cause(code) == cause


# Lines as shoal wrote them before causes existed and before phases were a closed set.
OLD_STATUS = (
    b'{"type":"runner_status_changed","env":{"event_id":"e1","origin":{"service":"worker","node":"n2","rank":1},'
    b'"wall_time":1,"mono_ns":1},"instance_id":"i1","rank":1,"status":"failed",'
    b'"detail":"lost peer: the ring group broke when another rank went away"}'
)
OLD_PHASES = ("idle", "loading", "warming_up", "agree_start", "prefill", "decode", "agree_cancel")


def test_a_status_from_before_causes_decodes_without_one() -> None:
    event = msgspec.json.decode(OLD_STATUS, type=AnyEvent)
    assert isinstance(event, RunnerStatusChanged) and event.cause is None and event.status == "failed"


@pytest.mark.parametrize("phase", OLD_PHASES)
def test_every_phase_an_old_heartbeat_carries_still_decodes(phase: str) -> None:
    line = (
        b'{"type":"runner_heartbeat","env":{"event_id":"e1","origin":{"service":"runner","node":"n1","rank":0},'
        b'"wall_time":1,"mono_ns":1},"instance_id":"i1","rank":0,"phase":"' + phase.encode() + b'"}'
    )
    event = msgspec.json.decode(line, type=AnyEvent)
    assert isinstance(event, RunnerHeartbeat) and event.phase == phase
