"""One `shoal up --workers 2` cluster shared by the tests of a module (starting one costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster

# Small prefill steps make many prefill iterations out of a short prompt, so a test can act
# "mid-prefill" without a long prompt; a short stall deadline keeps the failure tests fast.
E2E_SETTINGS = {"prefill_step_size": "64", "task_stall_seconds": "12", "node_timeout_seconds": "6"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("cluster"), workers=2, **E2E_SETTINGS)
    try:
        yield running.wait_ready()
    finally:
        running.stop()
