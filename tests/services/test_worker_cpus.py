"""Which CPU the worker gives each runner (`SHOAL_COMPUTE_CPU`): every worker on a host reads the
host's live ranks in one order, so co-located ranks get distinct CPUs of their shares."""

from __future__ import annotations

from events.fold import fold
from events.ids import InstanceId
from services.worker.plan import host_rank_index, ranks_on_host, ranks_sharing_host
from tests.events.builders import Events


def test_the_hosts_ranks_are_ordered_alike_for_every_worker() -> None:
    ev = Events()
    events = [ev.node("n1"), ev.node("n2"), ev.placed("i2", nodes=("n2", "n1")), ev.placed("i1")]
    state = fold(enumerate(events, start=1))
    keys = [(InstanceId("i1"), 0), (InstanceId("i1"), 1), (InstanceId("i2"), 0), (InstanceId("i2"), 1)]
    assert ranks_on_host(state, "127.0.0.1") == keys
    assert ranks_sharing_host(state, "127.0.0.1") == 4
    assert [host_rank_index(state, "127.0.0.1", key) for key in keys] == [0, 1, 2, 3]
    assert host_rank_index(state, "127.0.0.1", (InstanceId("gone"), 0)) == 0
    assert ranks_on_host(state, "10.0.0.9") == []
