"""`shoal up --masters 2`: two masters on the embedded bus, one leading by the lease and one
standing by; the cluster gets ready and serves as with one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster


@pytest.mark.timeout(240)
def test_shoal_up_with_two_masters_leads_with_one_and_serves(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, workers=1, masters="2")
    try:
        cluster.wait_ready(180)
        answer = cluster.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert answer.choices[0].finish_reason in ("stop", "length")
    finally:
        cluster.stop()
    log = cluster.up.tail(200_000)
    leaders = [name for name in ("master-0", "master-1") if f"master {name} leading" in log]
    assert len(leaders) == 1, log[-4000:]
    assert "standing by" in log
