"""`shoal bench serve`'s level summary: 429s are counted apart from errors, an error chunk in a
200 stream is an error, and events per token divide by the tokens of the requests served."""

from __future__ import annotations

from bench.serve import report
from bench.serve_load import Served, summarize_level


def test_a_level_counts_refusals_apart_from_errors_and_divides_events_by_served_tokens() -> None:
    served = [
        Served(status=200, ttft_ms=10.0, gaps_ms=[1.0, 3.0], tokens=3),
        Served(status=200, ttft_ms=30.0, gaps_ms=[2.0], tokens=2),
        Served(status=429, error="queue full"),
        Served(status=200, ttft_ms=5.0, tokens=1, error="task failed"),  # an error chunk mid-stream
        Served(status=0, error="ConnectError: refused"),
    ]
    level = summarize_level(served, wall_s=2.0, events=15)
    assert (level["requests"], level["served"], level["refused_429"], level["errors"]) == (5, 2, 1, 2)
    assert (level["tokens"], level["aggregate_tps"], level["events_per_token"]) == (5, 2.5, 3.0)
    assert (level["ttft_ms_p50"], level["ttft_ms_p99"], level["itl_ms_p50"], level["itl_ms_p99"]) == (
        10.0,
        30.0,
        2.0,
        3.0,
    )


def test_a_side_without_a_log_has_no_events_per_token() -> None:
    assert summarize_level([Served(status=200, tokens=4)], wall_s=1.0, events=None)["events_per_token"] is None


def _level(tps: float, errors: int = 0) -> dict[str, float | int]:
    return {"aggregate_tps": tps, "errors": errors, "served": 4 - errors, "refused_429": 0, "requests": 4}


def test_each_ratio_pairs_the_sides_round_by_round_and_errors_add_up_over_rounds() -> None:
    """Round i of one side is divided by round i of the other (both ran back to back, under the
    same neighbours), the target is judged on the median of those ratios, and an error in any
    round of the top level counts."""
    figures = {
        "tiny": {
            "mlx_lm_server": {1: [_level(50), _level(50)], 16: [_level(100), _level(200)]},
            "shoal_1w": {1: [_level(20), _level(40)], 16: [_level(150), _level(180)]},
            "shoal_2w": {1: [_level(20), _level(30)], 16: [_level(120), _level(180, errors=1)]},
        }
    }
    result = report({"rounds": 2}, figures, quick=False)
    comparisons = result["comparisons"]
    assert comparisons["tiny_1w_over_mlx_lm_c16"]["samples"] == [1.5, 0.9]
    assert comparisons["tiny_2w_over_1w_c16"]["samples"] == [0.8, 1.0]
    assert comparisons["tiny_1w_c16_over_1_stream"]["samples"] == [7.5, 4.5]
    assert result["targets"]["tiny_1w_c16_over_1_stream"] == {"target": ">= 6", "value": 6.0, "met": True}
    assert result["targets"]["tiny_shoal_errors_c16"]["value"] == 1
    assert result["measures"]["tiny_shoal_1w_c16_tps"]["samples"] == [150, 180]
