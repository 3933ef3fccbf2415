"""A ring port another program holds on the host does not keep the model from loading: the first
placement fails to bind it, and the retry takes other ports (docs/ARCHITECTURE.md §5). Before, every
retry took the same lowest free port and failed the same way, for good: a long-lived connection's
ephemeral port (the default base was 52100, inside Linux's ephemeral range) kept a cluster from
ever serving."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster, free_ring_base_port
from tests.e2e.conftest import E2E_SETTINGS


@pytest.mark.timeout(240)
def test_a_cluster_whose_ring_base_port_is_held_elsewhere_still_serves(tmp_path: Path) -> None:
    base = free_ring_base_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base))
        holder.listen()
        cluster = Cluster(tmp_path, workers=2, env={"SHOAL_RING_BASE_PORT": str(base)}, **E2E_SETTINGS)
        try:
            cluster.wait_ready(timeout=180)
            said = cluster.up.tail(20_000)
            assert f"ring port 127.0.0.1:{base} of rank 0 is held by another program" in said  # tried first
            reply = cluster.client().chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=4
            )
            assert reply.choices[0].message.content is not None
        finally:
            cluster.stop()
