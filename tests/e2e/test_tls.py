"""`shoal up` on a NATS server that requires mutual TLS: every connection of the cluster (the
services, the runners, the bulk log paths) speaks TLS with a certificate made here, and a chat
completion goes through the official openai client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.endpoint import NatsEndpoint
from eventlog.log import EventLog, LogError
from eventlog.tls import TlsFiles
from tests.e2e.cluster import Cluster
from tests.pki import Pki

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Pki]]:
    root = tmp_path_factory.mktemp("tls-cluster")
    pki = Pki(root, "cluster")
    files = pki.server_files(verify_clients=True)  # this host's certificate: served, and presented as a client
    env = {"SHOAL_NATS_TLS_CA": files.ca, "SHOAL_NATS_TLS_CERT": files.cert, "SHOAL_NATS_TLS_KEY": files.key}
    running = Cluster(root, workers=2, env=env)  # default deadlines: nothing here needs them short
    try:
        yield running.wait_ready(), pki
    finally:
        running.stop()


def test_a_chat_completion_through_a_cluster_on_mutual_tls(tls_cluster: tuple[Cluster, Pki]) -> None:
    cluster, _ = tls_cluster
    assert cluster.nats_url.startswith("tls://")
    assert cluster.runner_pids(), "the runners connect with the TLS settings their worker gave them"
    completion = cluster.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello over TLS"}], max_tokens=8
    )
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_the_clusters_server_refuses_a_client_without_a_certificate(
    tls_cluster: tuple[Cluster, Pki], tmp_path: Path
) -> None:
    cluster, pki = tls_cluster
    no_cert = NatsEndpoint(url=cluster.nats_url, tls=TlsFiles(ca=str(pki.ca)))
    with pytest.raises(LogError, match="requires a client certificate"):
        asyncio.run(EventLog.connect(no_cert, ensure=False, wait_seconds=1))
