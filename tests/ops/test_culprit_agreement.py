"""The master's watchdog and `shoal diagnose` blame the same ranks, for every hang of the catalogue.

Both judge with `events.culprit.name_culprit`; what is checked here is everything around it. Each
side builds its evidence from what it really holds — the master the folded State and the newest
heartbeat it had heard of each rank when it judged, with its stalled-task bounds; diagnose the
exported log with its own limits — and reports the verdict its own way: the master in the
`TaskFailed.rank` it writes, diagnose in a finding's stuck ranks.
"""

from __future__ import annotations

import pytest

from events.catalogue import TaskFailed
from services.master.core import judge_instance
from services.master.watchdog import blame
from services.ops.findings import Finding
from services.ops.offline import diagnose_scan
from services.ops.scan import scan
from services.ops.synthetic import LogBuilder
from tests.ops.scenarios import CATALOGUE, Case, folded, liveness


def master_blames(log: LogBuilder, finding: Finding) -> tuple[int, ...]:
    """The ranks the master blames for what `finding` is about, judged when the master would."""
    state = folded(log)
    if finding.instance_id is None:
        return ()  # never assigned: no instance, no rank to blame
    instance = state.instances[finding.instance_id]
    if finding.task_id is None:  # an idle instance: judged from the log alone, on a status or a node event
        culprit = judge_instance(state, instance)
        return culprit.ranks if culprit is not None else ()
    task = state.tasks[finding.task_id]
    moment = task.ended_at if task.ended else log.now_ns  # when it gave the task up, else now
    return blame(state, instance, task, liveness(log, moment), moment).ranks


def masters_failures(log: LogBuilder, task_id: str | None) -> list[TaskFailed]:
    return [
        r.event
        for r in log.records
        if isinstance(r.event, TaskFailed) and r.event.task_id == task_id and r.event.env.origin.service == "master"
    ]


@pytest.mark.parametrize("case", CATALOGUE, ids=lambda case: case.scenario.__name__)
def test_watchdog_and_diagnose_blame_the_same_ranks(case: Case) -> None:
    log = case.scenario()
    (finding,) = diagnose_scan(scan(enumerate(log.records, 1))).findings
    assert master_blames(log, finding) == finding.stuck_ranks
    # Where the master gave the task up itself, the rank it wrote is the one diagnose names
    # (none when several share the blame).
    sole = finding.stuck_ranks[0] if len(finding.stuck_ranks) == 1 else None
    assert [failed.rank for failed in masters_failures(log, finding.task_id)] in ([], [sole])


def test_the_catalogue_holds_the_masters_own_verdicts() -> None:
    """The check above compares real decisions, not only judgments made for the test."""
    decided = [c.scenario.__name__ for c in CATALOGUE if masters_failures(c.scenario(), "t1")]
    assert {"watchdog_failed_after_silence", "sleeping_rank_short_deadline", "frozen_rank_short_deadline"} <= set(
        decided
    )
    assert "killed_then_peer_failed" in decided
