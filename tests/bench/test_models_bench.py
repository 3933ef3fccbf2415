"""`shoal bench models`: the warm-ups read from the log (pure), the report's pairing and targets,
and the bench itself run quick on both sides (structure and consistency, never a speed: the suite
runs on shared machines)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.models import Runs, report
from bench.result import KEYS
from bench.warmups import Warmup, first_warmup, warmups
from events.catalogue import LogEvent
from tests.events.builders import Events

ROOT = Path(__file__).resolve().parents[2]


def test_a_warmup_runs_from_placement_until_every_rank_has_reported_ready() -> None:
    e = Events()
    log: list[LogEvent] = [e.placed("i1", nodes=("n1", "n2"))]
    e.clock.advance(1.0)
    log += [e.runner(0, "loading", "i1"), e.runner(1, "loading", "i1")]
    e.clock.advance(2.0)
    log += [e.runner(0, "warming_up", "i1")]
    e.clock.advance(0.5)
    log += [e.runner(1, "warming_up", "i1"), e.runner(0, "ready", "i1")]
    e.clock.advance(0.25)
    log.append(e.placed("i2", nodes=("n1",)))  # never ready
    e.clock.advance(0.25)
    log += [e.runner(1, "running", "i1")]  # a running rank has warmed up: every rank ready now
    e.clock.advance(5.0)
    log += [e.runner(0, "running", "i1"), e.runner(0, "loading", "i2")]  # later reports change nothing
    found = warmups(enumerate(log, start=1))
    assert [w.instance_id for w in found] == ["i1", "i2"]
    first, never = found
    assert first.ms == 4000.0 and first.phases_ms() == {"loading": 1000.0, "warming_up": 3500.0, "ready": 4000.0}
    assert never.ms is None and never.phases_ms() == {"loading": 5250.0, "warming_up": None, "ready": None}
    assert first_warmup(found, "tiny") == first and first_warmup(found, "other") is None


def _level(ttft: float, tps: float, served: int = 4, errors: int = 0) -> dict[str, Any]:
    by_model = {"a": {"served": served // 2}, "b": {"served": served - served // 2}}
    return {
        "ttft_ms_p50": ttft,
        "ttft_ms_p99": ttft * 2,
        "aggregate_tps": tps,
        "requests": served + errors,
        "served": served,
        "errors": errors,
        "refused_429": 0,
        "by_model": by_model,
    }


def _warm(instance: str, ms: float, seq: int) -> Warmup:
    return Warmup(instance, "path/" + instance, seq, 0, int(ms * 1e6))


def test_ratios_pair_the_sides_round_by_round_and_cold_loads_are_judged_against_the_up_warmup() -> None:
    figures = {
        "mlx_lm_server": {1: [_level(400, 10), _level(300, 20)]},
        "shoal": {1: [_level(20, 30), _level(60, 20)]},
    }
    cold = {
        "a": [
            {"ttft_ms": 1100.0, "instance_id": "a1", "new_instance": True},
            {"ttft_ms": 1300.0, "instance_id": "a2", "new_instance": True},
        ],
        "b": [
            {"ttft_ms": 900.0, "instance_id": "b1", "new_instance": False},
            {"ttft_ms": 800.0, "instance_id": "b2", "new_instance": True},
        ],
    }
    found = [_warm("a0", 1000, 1), _warm("b0", 2000, 2), _warm("a1", 1000, 3), _warm("b1", 700, 4)]
    steady = {"mlx_lm_server": [_level(200, 40), _level(100, 40)], "shoal": [_level(20, 20), _level(60, 30)]}
    result = report({}, Runs(figures, steady, cold, {"a": found[0], "b": found[1]}, found), {}, quick=True)
    comparisons, targets = result["comparisons"], result["targets"]
    assert comparisons["mlx_lm_over_shoal_ttft_p50_c1"]["samples"] == [20.0, 5.0]
    assert targets["mlx_lm_over_shoal_ttft_p50_c1"] == {"target": ">= 10", "value": 12.5, "met": True}
    assert comparisons["shoal_over_mlx_lm_tps_c1"]["samples"] == [3.0, 1.0]
    assert targets["shoal_over_mlx_lm_tps_c1"]["met"] is True  # median 2.0
    assert comparisons["a_cold_ttft_over_up_warmup"]["samples"] == [1.1, 1.3]
    assert targets["a_cold_ttft_over_up_warmup"] == {"target": "<= 1.2", "value": 1.2, "met": True}
    assert targets["b_cold_ttft_over_up_warmup"]["value"] == 0.425
    assert result["measures"]["a_cold_instance_warmup_ms"]["samples"] == [1000.0]  # a2 never warmed up
    assert result["checks"]["every_cold_request_placed_a_new_instance"] is False  # b1 reused an instance
    assert result["checks"]["both_models_served_in_every_level"] is True
    assert comparisons["shoal_over_mlx_lm_steady_tps_c1"]["samples"] == [0.5, 0.75]
    assert "1,100 ms of a's 1,200 ms" not in result["notes"][0] and "1,000 ms of a's 1,200 ms" in result["notes"][0]
    assert not any("not met" in note for note in result["notes"])  # every target above is met


def test_a_level_where_one_model_was_never_served_fails_its_check_and_a_missed_target_is_explained() -> None:
    figures = {"mlx_lm_server": {1: [_level(400, 10, served=1)]}, "shoal": {1: [_level(200, 5)]}}
    steady = {"mlx_lm_server": [_level(100, 40)], "shoal": [_level(150, 20)]}
    result = report({}, Runs(figures, steady, {"a": [], "b": []}, {"a": None, "b": None}, []), {}, quick=True)
    assert result["checks"]["both_models_served_in_every_level"] is False
    assert result["checks"]["every_model_warmed_up_at_shoal_up"] is False
    ceilings = result["comparisons"]
    assert ceilings["ceiling_ttft_p50_c1"]["samples"] == [4.0] and ceilings["ceiling_tps_c1"]["samples"] == [4.0]
    missed = result["notes"][-1]
    assert missed.startswith("not met: mlx_lm_over_shoal_ttft_p50_c1, shoal_over_mlx_lm_tps_c1, each bounded by")
    for name in ("mlx_lm_over_shoal_ttft_p50_c1", "shoal_over_mlx_lm_tps_c1"):
        assert "switch costs it only 4 x on these models" in result["targets"][name]["note"], name
    assert "without switching: 0.5 x tok/s, TTFT p50 150 ms against 100 ms" in missed


def test_a_missed_target_above_one_client_is_split_into_the_one_client_ratio_and_each_sides_scaling() -> None:
    figures = {
        "mlx_lm_server": {1: [_level(80, 100)] * 3, 8: [_level(1200, 150), _level(1400, 140), _level(1300, 160)]},
        "shoal": {1: [_level(20, 100)] * 3, 8: [_level(150, 300), _level(140, 310), _level(130, 320)]},
    }
    steady = {"mlx_lm_server": [_level(25, 110)] * 3, "shoal": [_level(20, 100)] * 3}
    result = report({}, Runs(figures, steady, {"a": [], "b": []}, {"a": None, "b": None}, []), {}, quick=True)
    judged = result["targets"]["mlx_lm_over_shoal_ttft_p50_c8"]
    assert judged["met"] is True and judged["value"] == 10  # the median of the rounds' ratios 8, 10, 10
    ttft = result["targets"]["mlx_lm_over_shoal_ttft_p50_c1"]
    assert ttft["met"] is False and "switch costs it only 3.2 x" in ttft["note"]  # one client: the switch's ceiling
    tps = result["targets"]["shoal_over_mlx_lm_tps_c8"]
    assert tps["met"] is True  # 2, 2.21, 2: median 2
    figures["shoal"][8] = [_level(400, 150), _level(300, 155), _level(350, 160)]  # shoal's TTFT grew 17.5x
    result = report({}, Runs(figures, steady, {"a": [], "b": []}, {"a": None, "b": None}, []), {}, quick=True)
    note = result["targets"]["mlx_lm_over_shoal_ttft_p50_c8"]["note"]
    assert note.startswith("in medians, 3.71 x (the judged figure is the median of the rounds' ratios) is the sides'")
    assert "ratio at 1 client (4 x," in note
    assert "mlx_lm.server's went 80 -> 1,300 ms (16.2 x), shoal's 20 -> 350 ms (17.5 x, its requests batched)" in note
    tps_note = result["targets"]["shoal_over_mlx_lm_tps_c8"]["note"]
    assert "aggregate tok/s scaled from 1 to 8 clients: mlx_lm.server's went 100 -> 150 tok/s (1.5 x)" in tps_note


@pytest.mark.timeout(420)
def test_models_bench_runs_quick_on_both_sides() -> None:
    """Both sides answer every request of both models; every cold request placed a new instance,
    and its TTFT holds that instance's whole warm-up (a first token cannot come before the model
    is loaded: a TTFT shorter than it would mean the request was served warm)."""
    argv = [sys.executable, "-m", "services.cli", "bench", "models", "--quick", "--json"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(result) and result["bench"] == "models" and result["quick"] is True
    assert all(result["checks"].values()), result["checks"]
    for name in ("mlx_lm_over_shoal_ttft_p50_c1", "shoal_over_mlx_lm_tps_c1", "tiny_cold_ttft_over_up_warmup"):
        assert isinstance(result["targets"][name]["met"], bool) and result["targets"][name]["value"] > 0, name
    for side in ("mlx_lm_server", "shoal"):
        for rounds in result["details"]["levels"][side].values():
            for level in rounds:
                assert level["errors"] == 0 and all(m["served"] > 0 for m in level["by_model"].values()), level
    warm = {w["instance_id"]: w["warmup_ms"] for w in result["details"]["warmups"]}
    for label, colds in result["details"]["cold"].items():
        for cold in colds:
            assert cold["new_instance"] and cold["tokens"] > 0, (label, cold)
            assert cold["ttft_ms"] > warm[cold["instance_id"]] > 0, (label, cold, warm)
    for instances in result["details"]["placements"].values():
        assert [len(i["shards"]) for i in instances] == [1]  # min_nodes_per_instance 1: one node each
