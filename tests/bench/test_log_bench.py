"""`shoal bench log` on the session's nats-server: every side measured every round, every State equal."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import bench.log
from bench.log import RATES, SERVER_WRITES, SYNC_SIDES, TLS_READER, run


def test_the_log_benchmark_measures_every_side_each_round_and_its_states_agree(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench.log, "configure_logging", lambda _config: None)  # keep pytest's log capture
    result = run(argparse.Namespace(events=1000, rounds=2, nats_url=nats_url, quick=False))
    assert result["settings"] == {"events": 1000, "rounds": 2}
    assert result["checks"] and all(result["checks"].values()), result["checks"]
    assert {"replay_nats_py_state_equals_live", "replay_state_equals_live", "appended_once"} <= set(result["checks"])
    assert set(result["measures"]) == set(RATES) - set(SYNC_SIDES) - {TLS_READER}  # a given server: no side servers
    assert all(m["n"] == 2 and m["median"] > 0 for m in result["measures"].values())
    assert result["comparisons"]["replay_vs_nats_py"]["n"] == 2
    assert set(result["targets"]) == {"replay_per_s", "fold_per_s", "raw_over_append"}


@pytest.mark.timeout(240)
def test_without_a_server_it_compares_shoals_fsync_policy_with_always_and_nats_servers_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bench.log, "configure_logging", lambda _config: None)
    result = run(argparse.Namespace(events=1000, rounds=2, nats_url=None, quick=False, fsync=True))
    assert result["variant"] == "fsync"
    checks = result["checks"]
    assert {"appended_once_append_fsync_always", "appended_once_append_fsync_2m"} <= set(checks), checks
    assert all(checks.values()), checks
    assert set(result["measures"]) == set(RATES) - {TLS_READER}
    for name in ("fsync_always_cost", "fsync_1s_cost"):
        assert result["comparisons"][name]["n"] == 2 and result["comparisons"][name]["median"] > 0
    assert {"append_fsync_always_per_s", "fsync_always_cost", "fsync_1s_cost"} <= set(result["headline"])


@pytest.mark.timeout(240)
def test_with_tls_it_replays_the_same_events_from_a_tls_server_in_the_same_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bench.log, "configure_logging", lambda _config: None)
    result = run(argparse.Namespace(events=1000, rounds=2, nats_url=None, quick=False, tls=True))
    assert result["variant"] == "tls"
    checks = result["checks"]
    assert {"appended_once_tls", "replay_tls_state_equals_live", "replay_state_equals_live"} <= set(checks), checks
    assert all(checks.values()), checks
    writes = set(SERVER_WRITES.values()) if Path("/proc/self/io").exists() else set()
    assert set(result["measures"]) == set(RATES) - set(SYNC_SIDES) | writes
    assert result["measures"][TLS_READER]["n"] == 2
    for name in writes:  # counted around each replay: a replay writes at least its events' bytes
        assert result["measures"][name]["n"] == 2 and result["measures"][name]["median"] > 0
    assert result["comparisons"]["tls_replay_cost"]["n"] == 2 and result["comparisons"]["tls_replay_cost"]["median"] > 0
    assert result["targets"]["tls_replay_cost"]["target"] == "<= 1.5"
    assert {"replay_tls_per_s", "tls_replay_cost"} <= set(result["headline"])


def test_tls_and_fsync_are_separate_records_and_need_embedded_servers() -> None:
    with pytest.raises(SystemExit, match="pass one of them"):
        run(argparse.Namespace(events=1000, rounds=2, nats_url=None, quick=False, tls=True, fsync=True))
    with pytest.raises(SystemExit, match="leave out --nats-url"):
        run(argparse.Namespace(events=1000, rounds=2, nats_url="nats://127.0.0.1:4222", quick=False, tls=True))


def test_a_missed_replay_or_append_target_says_what_bounds_it_from_the_runs_own_figures() -> None:
    measures = {
        "replay_per_s": {"median": 50_000.0},
        "fold_per_s": {"median": 200_000.0},
        "replay_nats_py_per_s": {"median": 20_000.0},
        "raw_nats_publish_per_s": {"median": 250_000.0},
        "append_per_s": {"median": 100_000.0},
    }
    replay = bench.log.replay_account(measures)
    assert "20.00 us an event" in replay and "fold alone (decode and apply) is 5.00 us" in replay
    assert "the read the other 15.00 us" in replay and "50.00 us" in replay  # nats-py's, beside
    append = bench.log.append_account(measures)
    assert "10.00 us an event against a raw publish's 4.00 us" in append
    assert bench.log.replay_account({}) == "no replay or no fold was measured"
