"""`shoal bench serve`'s level summary: 429s are counted apart from errors, an error chunk in a
200 stream is an error, and events per token divide by the tokens of the requests served."""

from __future__ import annotations

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
