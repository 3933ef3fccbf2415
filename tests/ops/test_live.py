"""`--nats-url`: the same diagnosis read live from JetStream (a real nats-server, never a mock)."""

from __future__ import annotations

import asyncio
import json

import pytest

from eventlog.log import EventLog
from services.cli import main
from tests.ops import scenarios


@pytest.mark.timeout(60)
async def test_diagnose_and_replay_read_both_streams_live(
    event_log: EventLog, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scenarios.compute_stall()
    await event_log.append_many([record.event for record in log.records])  # heartbeats go to SHOAL_TELEMETRY
    # The log ended 40 s after the stall began; judge it as of then, not the test's wall clock.
    now = "2026-01-01T00:00:41.200Z"
    code = await asyncio.to_thread(main, ["diagnose", "--nats-url", nats_url, "--json", "--now", now])
    assert code == 1
    out = json.loads(capsys.readouterr().out)
    assert [(f["cause"], f["stuck_ranks"]) for f in out["findings"]] == [("stalled_in_compute", [1])]
    assert out["findings"][0]["ranks"][1]["stack"] is not None

    code = await asyncio.to_thread(main, ["replay", "--nats-url", nats_url, "--task", "t1"])
    assert code == 0
    assert "flight recorder: stuck in prefill" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_unreachable_nats_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--nats-url", "nats://127.0.0.1:1"]) == 2
    assert "cannot connect" in capsys.readouterr().err
