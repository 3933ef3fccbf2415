"""One cluster across network namespaces shared by the module's fault tests (starting seven
processes on three kinds of host costs tens of seconds), and the checker every test ends with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from bench.hosts import unavailable_reason
from bench.netclient import ClientCall, stream_chat
from bench.netcluster import NetCluster
from tests.netns.checker import read_tasks, violations


@pytest.fixture(scope="session")
def netns_available() -> None:
    reason = unavailable_reason()  # probed once: the kernel or the user may forbid namespaces
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def shared_cluster(netns_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetCluster]:
    cluster = NetCluster(tmp_path_factory.mktemp("netns"))  # stops itself if it cannot start
    try:
        cluster.wait_ready(150)
        with cluster.http() as http:  # one request alone first: see the report on concurrent first requests
            warm = stream_chat(http, "hello", 4, bound_seconds=60)
        assert warm.outcome == "completed", f"{warm}\n{cluster.tails()}"
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(shared_cluster: NetCluster) -> NetCluster:
    """The shared cluster, whole and serving: its three NATS servers current (a test that killed
    one started it again, and it catches up from its peers: killing another before that would be
    two faults at once), and an instance ready. A test that left it otherwise (a fault the current
    code does not recover from) is followed by what an operator would do, restarting what died or
    went silent, so one unrecovered fault fails its own test and not every later one."""
    try:
        return shared_cluster.wait_nats_whole(90).wait_ready(15)
    except TimeoutError:
        shared_cluster.restart_all()
        return shared_cluster.wait_nats_whole(90).wait_ready(90)


def assert_checked(cluster: NetCluster, calls: list[ClientCall]) -> None:
    """The end of every fault test: each task completed with its full text or failed with a
    diagnosis, no acknowledged event lost, no hang."""
    # The last TaskCompleted reaches the log after the client's [DONE], and a replay served by a
    # NATS server that is still catching up may end early: read again for a while before judging.
    deadline = time.monotonic() + 10
    while True:
        time.sleep(1.0)
        found = violations(calls, asyncio.run(read_tasks(cluster.admin_endpoint())))
        if not found or time.monotonic() > deadline:
            break
    assert not found, "\n".join(found) + "\n" + cluster.tails()
