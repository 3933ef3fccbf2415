"""While NATS is gone, nats-py reports a failed try four times a second per connection: the log
gets the first of each error, then one line per interval saying how many were left out."""

from __future__ import annotations

from eventlog.client import RepeatedErrors


def test_the_first_of_each_error_then_one_per_interval_with_the_count_left_out() -> None:
    now = [0.0]
    repeats = RepeatedErrors(every_seconds=30.0, clock=lambda: now[0])
    refused, eof = "Connect call failed", "unexpected EOF"
    logged: list[tuple[float, str, int]] = []
    for _ in range(400):  # 100 s of tries every 0.25 s
        for text in (refused, eof) if now[0] == 0.0 else (refused,):
            if (left_out := repeats.left_out_before(text)) is not None:
                logged.append((now[0], text, left_out))
        now[0] += 0.25
    assert logged == [
        (0.0, refused, 0),
        (0.0, eof, 0),
        (30.0, refused, 119),
        (60.0, refused, 119),
        (90.0, refused, 119),
    ]


def test_after_a_reconnect_the_next_outage_is_reported_at_once() -> None:
    now = [0.0]
    repeats = RepeatedErrors(every_seconds=30.0, clock=lambda: now[0])
    assert repeats.left_out_before("refused") == 0
    now[0] = 5.0
    assert repeats.left_out_before("refused") is None
    repeats.clear()
    assert repeats.left_out_before("refused") == 0
