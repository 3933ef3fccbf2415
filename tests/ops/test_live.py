"""`--nats-url`, or no source flag at all (the configured cluster): the same diagnosis read live from
JetStream (a real nats-server, never a mock)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from eventlog.log import EventLog
from services.cli import main
from services.nats import EmbeddedNats
from tests.ops import scenarios

# The log ended 40 s after the stall began; judge it as of then, not the test's wall clock.
STALL_END = "2026-01-01T00:00:41.200Z"


def configure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **settings: str) -> None:
    """Only `settings` configure the cluster: no shoal.yaml, no other SHOAL_* setting from outside."""
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith("SHOAL_")]:
        monkeypatch.delenv(name)
    for key, value in settings.items():
        monkeypatch.setenv(f"SHOAL_{key.upper()}", value)


@pytest.mark.timeout(60)
async def test_diagnose_and_replay_read_both_streams_live(
    event_log: EventLog, nats_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    log = scenarios.compute_stall()
    await event_log.append_many([record.event for record in log.records])  # heartbeats go to SHOAL_TELEMETRY
    code = await asyncio.to_thread(main, ["diagnose", "--nats-url", nats_url, "--json", "--now", STALL_END])
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("setting", ["nats_url", "nats_port"])
async def test_diagnose_and_replay_without_a_source_read_the_configured_cluster(
    setting: str,
    event_log: EventLog,
    nats_server: EmbeddedNats,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`nats_url` set, or unset so the embedded server's address (nats_host:nats_port) is used."""
    await event_log.append_many([record.event for record in scenarios.compute_stall().records])
    code = await asyncio.to_thread(main, ["diagnose", "--nats-url", nats_server.url, "--json", "--now", STALL_END])
    named = capsys.readouterr().out
    configure(monkeypatch, tmp_path, **{setting: nats_server.url if setting == "nats_url" else str(nats_server.port)})
    assert await asyncio.to_thread(main, ["diagnose", "--json", "--now", STALL_END]) == code == 1
    assert capsys.readouterr().out == named
    assert json.loads(named)["findings"][0]["cause"] == "stalled_in_compute"
    assert await asyncio.to_thread(main, ["replay", "--task", "t1"]) == 0  # replay reads the same cluster
    assert "flight recorder: stuck in prefill" in capsys.readouterr().out


@pytest.mark.timeout(30)
def test_no_source_and_no_configured_cluster_says_what_to_do(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    configure(monkeypatch, tmp_path, nats_port="1")
    for command in ("diagnose", "replay"):
        assert main([command]) == 2
        err = capsys.readouterr().err
        assert "no --file or --nats-url given" in err and "nats://127.0.0.1:1" in err
        assert "shoal up" in err and "--file FILE" in err
