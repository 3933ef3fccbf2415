"""`shoal bench serve`'s level summary: 429s with Retry-After are counted apart from errors (one
without is an error), an error chunk in a 200 stream is an error, a hang is counted apart, and
events per token divide by the tokens of the requests served; its report reads shoal against the
faster anchor per round and judges errors and hangs at every level."""

from __future__ import annotations

from bench.serve import failure_notes, model_settings, report
from bench.serve_load import Served, summarize_level


def test_a_level_counts_refusals_apart_from_errors_and_divides_events_by_served_tokens() -> None:
    served = [
        Served(status=200, ttft_ms=10.0, gaps_ms=[1.0, 3.0], tokens=3),
        Served(status=200, ttft_ms=30.0, gaps_ms=[2.0], tokens=2),
        Served(status=429, error="queue full", retry_after="2"),
        Served(status=429, error="queue full"),  # no Retry-After: the client is not told when to come back
        Served(status=200, ttft_ms=5.0, tokens=1, error="task failed"),  # an error chunk mid-stream
        Served(status=0, error="ConnectError: refused", retries=3),
        Served(status=0, error="hang: ReadTimeout", hung=True),
    ]
    level = summarize_level(served, wall_s=2.0, events=15)
    assert (level["requests"], level["served"], level["refused_429"], level["errors"]) == (7, 2, 1, 3)
    assert (level["hangs"], level["retries"]) == (1, 3)
    assert (level["tokens"], level["aggregate_tps"], level["events_per_token"]) == (5, 2.5, 3.0)
    assert (level["ttft_ms_p50"], level["ttft_ms_p99"], level["itl_ms_p50"], level["itl_ms_p99"]) == (
        10.0,
        30.0,
        2.0,
        3.0,
    )


def test_a_side_without_a_log_has_no_events_per_token() -> None:
    assert summarize_level([Served(status=200, tokens=4)], wall_s=1.0, events=None)["events_per_token"] is None


def _level(tps: float, errors: int = 0, hangs: int = 0) -> dict[str, float | int]:
    served = 4 - errors - hangs
    return {"aggregate_tps": tps, "errors": errors, "hangs": hangs, "served": served, "refused_429": 0, "requests": 4}


def test_each_ratio_pairs_the_sides_round_by_round_and_errors_add_up_over_rounds() -> None:
    """Round i of one side is divided by round i of the other (both ran back to back, under the
    same neighbours), the target is judged on the median of those ratios, and an error or a hang in
    any round of any level counts, not only at the top level."""
    figures = {
        "tiny": {
            "mlx_lm_server": {1: [_level(50), _level(50)], 16: [_level(100), _level(200)]},
            "shoal_1w": {1: [_level(20), _level(40, hangs=1)], 16: [_level(150), _level(180)]},
            "shoal_2w": {1: [_level(20, errors=2), _level(30)], 16: [_level(120), _level(180, errors=1)]},
        }
    }
    result = report({"rounds": 2}, figures, quick=False)
    comparisons, targets = result["comparisons"], result["targets"]
    assert comparisons["tiny_1w_over_mlx_lm_c16"]["samples"] == [1.5, 0.9]
    assert comparisons["tiny_2w_over_1w_c16"]["samples"] == [0.8, 1.0]
    assert comparisons["tiny_1w_c16_over_1_stream"]["samples"] == [7.5, 4.5]
    assert targets["tiny_1w_c16_over_1_stream"] == {"target": ">= 6", "value": 6.0, "met": True}
    assert targets["tiny_1w_over_mlx_lm_c16"]["target"] == ">= 2"  # where serving overhead dominates
    assert (targets["tiny_shoal_errors_every_level"]["value"], targets["tiny_shoal_hangs_every_level"]["value"]) == (
        3,
        1,
    )
    assert "shoal_2w at 1: 2 errors" in targets["tiny_shoal_errors_every_level"]["note"]
    assert result["measures"]["tiny_shoal_1w_c16_tps"]["samples"] == [150, 180]
    assert result["checks"]["every_level_answered_every_request"]


def test_shoal_is_read_against_the_faster_anchor_of_each_round_and_against_its_engine_alone() -> None:
    figures = {
        "qwen3-0.6b": {
            "mlx_lm_server": {16: [_level(100), _level(90)], 64: [_level(100), _level(100)]},
            "mlx_lm_server_pinned": {16: [_level(80), _level(120)], 64: [_level(50), _level(200)]},
            "shoal_1w": {16: [_level(110), _level(108)], 64: [_level(150), _level(150)]},
            "shoal_engine_alone": {16: [_level(110), _level(120)], 64: [_level(200), _level(150)]},
        }
    }
    result = report({"rounds": 2}, figures, quick=False)
    comparisons, targets = result["comparisons"], result["targets"]
    assert comparisons["qwen3-0.6b_1w_over_mlx_lm_c16"]["samples"] == [1.1, 0.9]  # 110/100, 108/120
    assert comparisons["qwen3-0.6b_1w_over_mlx_lm_c64"]["samples"] == [1.5, 0.75]  # 150/100, 150/200
    assert comparisons["qwen3-0.6b_mlx_lm_pinned_over_unpinned_c16"]["samples"] == [0.8, 1.333]
    assert comparisons["qwen3-0.6b_1w_over_engine_alone_c64"]["samples"] == [0.75, 1.0]
    assert targets["qwen3-0.6b_1w_over_mlx_lm_c16"]["target"] == ">= 1"
    assert targets["qwen3-0.6b_1w_over_engine_alone_c16"]["met"] is True  # median of 1.0 and 0.9
    missed = targets["qwen3-0.6b_1w_over_engine_alone_c64"]
    assert missed["met"] is False and "events per token" in missed["note"]


def test_on_a_model_where_serving_costs_dominate_the_engine_alone_bounds_the_ratio_over_the_anchor() -> None:
    figures = {
        "tiny": {
            "mlx_lm_server": {16: [_level(100), _level(100)]},
            "shoal_1w": {16: [_level(130), _level(140)]},
            "shoal_engine_alone": {16: [_level(170), _level(190)]},
        }
    }
    result = report({"rounds": 2}, figures, quick=False)
    comparisons, targets = result["comparisons"], result["targets"]
    assert comparisons["tiny_engine_alone_over_mlx_lm_c16"]["samples"] == [1.7, 1.9]
    assert "tiny_1w_over_engine_alone_c16" in comparisons  # reported, judged only where compute dominates
    assert "tiny_1w_over_engine_alone_c16" not in targets
    missed = targets["tiny_1w_over_mlx_lm_c16"]  # >= 2: beyond what the engine alone reached
    assert missed["met"] is False
    assert "engine alone (the same batch in one process, no services) decoded 180 tok/s" in missed["note"]
    assert "against shoal_1w's 135: 1.8x the anchor, what serving at no cost would reach" in missed["note"]


def test_kv_bits_8_is_judged_at_16_clients_against_one_client_of_its_own_side() -> None:
    figures = {"tiny": {"shoal_1w_kv8": {1: [_level(40), _level(50)], 16: [_level(160), _level(100)]}}}
    result = report({"rounds": 2}, figures, quick=False)
    assert result["comparisons"]["tiny_1w_kv8_c16_over_1_stream"]["samples"] == [4.0, 2.0]
    judged = result["targets"]["tiny_1w_kv8_c16_over_1_stream"]
    assert (judged["target"], judged["value"], judged["met"]) == (">= 3", 3.0, True)


def test_the_compute_bound_model_runs_its_own_sizes_unless_a_flag_names_them() -> None:
    settings = {
        "concurrency": "1,4,16,64",
        "max_tokens": 64,
        "requests_per_client": 2,
        "rounds": 3,
        "max_queued_tasks": 64,
        "stall_timeout": 300.0,
        "ready_timeout": 300.0,
    }
    assert model_settings(settings, "tiny", given=set())["levels"] == [1, 4, 16, 64]
    own = model_settings(settings, "qwen3-0.6b", given=set())
    assert (own["levels"], own["max_tokens"], own["requests_per_client"]) == ([16, 64], 32, 1)
    assert own["ready_timeout"] > settings["ready_timeout"]  # its warm-up takes minutes
    assert model_settings(settings, "qwen3-0.6b", given={"max_tokens"})["max_tokens"] == 64


def test_a_side_that_failed_requests_is_named_in_a_note_the_anchor_too() -> None:
    dead = _level(0, errors=4) | {"first_errors": ["ConnectError: All connection attempts failed"]}
    figures = {
        "qwen3-0.6b": {
            "mlx_lm_server": {16: [_level(26), dead]},
            "shoal_1w": {16: [_level(36), _level(35)]},
        }
    }
    assert failure_notes(figures) == [
        "qwen3-0.6b: mlx_lm_server failed 4 of 8 requests (first: ConnectError: All connection attempts failed)"
    ]
