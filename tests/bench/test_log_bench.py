"""`shoal bench log` on the session's nats-server: every side measured every round, every State equal."""

from __future__ import annotations

import argparse

import pytest

import bench.log
from bench.log import RATES, SYNC_SIDES, run


def test_the_log_benchmark_measures_every_side_each_round_and_its_states_agree(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench.log, "configure_logging", lambda _config: None)  # keep pytest's log capture
    result = run(argparse.Namespace(events=1000, rounds=2, nats_url=nats_url, quick=False))
    assert result["settings"] == {"events": 1000, "rounds": 2}
    assert result["checks"] and all(result["checks"].values()), result["checks"]
    assert {"replay_nats_py_state_equals_live", "replay_state_equals_live", "appended_once"} <= set(result["checks"])
    assert set(result["measures"]) == set(RATES) - set(SYNC_SIDES)  # a given server: no fsync comparison
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
    assert set(result["measures"]) == set(RATES)
    for name in ("fsync_always_cost", "fsync_1s_cost"):
        assert result["comparisons"][name]["n"] == 2 and result["comparisons"][name]["median"] > 0
    assert {"append_fsync_always_per_s", "fsync_always_cost", "fsync_1s_cost"} <= set(result["headline"])
