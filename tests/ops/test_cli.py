from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from services.cli import main
from tests.ops import scenarios

ExportFile = Callable[..., Path]


def test_diagnose_exits_0_on_a_healthy_log(export_file: ExportFile, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--file", str(export_file(scenarios.healthy()))]) == 0
    assert "no findings" in capsys.readouterr().out


def test_diagnose_exits_1_with_findings_and_json_for_tools(
    export_file: ExportFile, capsys: pytest.CaptureFixture[str]
) -> None:
    path = export_file(scenarios.collective_stall(), tail=b'{"broken')
    assert main(["diagnose", "--file", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["reference"] == "end_of_log"
    assert [(f["cause"], f["stuck_ranks"]) for f in out["findings"]] == [("stalled_in_collective", [0, 1])]
    assert out["skipped"].startswith(f"line {len(scenarios.collective_stall().records) + 1}: truncated")
    assert "diagnosed what came before" in captured.err


def test_diagnose_now_and_limits_flags(export_file: ExportFile, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(export_file(scenarios.quiet_no_telemetry()))
    assert main(["diagnose", "--file", path, "--stuck-after", "120"]) == 0
    assert main(["diagnose", "--file", path, "--stuck-after", "120", "--now", "2026-01-01T01:00:00Z"]) == 1


def test_missing_file_is_exit_2_with_advice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--file", str(tmp_path / "nope.jsonl")]) == 2
    assert "shoal events export" in capsys.readouterr().err


def test_replay_prints_the_timeline_and_its_finding(
    export_file: ExportFile, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "--file", str(export_file(scenarios.runner_failed())), "--task", "t1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("task t1  model tiny  status prefilling")
    assert "prefill started: pipeline" in out and "[rank_died] task t1" in out


def test_replay_unknown_task_lists_nearest(export_file: ExportFile, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--file", str(export_file(scenarios.healthy())), "--task", "t2"]) == 2
    assert "unknown task 't2'; nearest: t1" in capsys.readouterr().err


def test_replay_at_a_sequence_shows_the_state_then(export_file: ExportFile, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(export_file(scenarios.healthy()))
    assert main(["replay", "--file", path, "--at", "6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("State at event seq 6")
    assert "t1  created  -" in out
    assert main(["replay", "--file", path, "--at", "2026-01-01T00:00:00.5Z", "--json"]) == 0
    state = json.loads(capsys.readouterr().out)["state"]
    assert state["last_seq"] == 5 and state["tasks"] == {}


def test_replay_json_and_html(export_file: ExportFile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "t1.html"
    path = str(export_file(scenarios.compute_stall()))
    assert main(["replay", "--file", path, "--task", "t1", "--json", "--html", str(html)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["timeline"]["task_id"] == "t1" and out["findings"][0]["cause"] == "stalled_in_compute"
    assert html.read_text().count('class="bar"') > 0


def test_bad_at_value_is_explained(export_file: ExportFile, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--file", str(export_file(scenarios.healthy())), "--at", "yesterday"]) == 2
    assert "ISO time" in capsys.readouterr().err


def test_diagnose_reports_the_current_run_and_history_on_request(
    export_file: ExportFile, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scenarios.LogBuilder()
    log.cluster_started()
    log.node_joined("n1")
    log.instance_placed("i1", ["n1"])
    log.runner_status("i1", 0, "loading")  # a run stopped while loading: stuck for ever after
    log.advance(700)
    log.cluster_started()
    path = str(export_file(log))
    assert main(["diagnose", "--file", path]) == 0  # nothing wrong now
    assert "1 finding(s) of earlier runs not shown" in capsys.readouterr().out
    assert main(["diagnose", "--file", path, "--history"]) == 1
    assert "(run 1) [instance_not_ready] instance i1" in capsys.readouterr().out


def test_replay_of_a_task_from_an_earlier_run_still_shows_its_finding(
    export_file: ExportFile, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scenarios.LogBuilder()
    log.cluster_started()
    log.node_joined("n1")
    log.ready_instance("i1", ["n1"])
    log.task_created("t1")
    log.task_assigned("t1", "i1")
    log.failed("t1", "ValueError: boom", rank=0)
    log.cluster_started()
    assert main(["replay", "--file", str(export_file(log)), "--task", "t1"]) == 0
    assert "[rank_error] task t1" in capsys.readouterr().out
