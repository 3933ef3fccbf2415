"""The worker's pure rules: which runner processes should exist on this node (target vs current),
and when to announce the node again.

Target: a runner for every shard on this node of every instance that is not retired. A runner
that already ran for an (instance, rank) is never started again in this worker's life: if it
died, the master retires the instance and places a new one, so restarting it would only race
the re-placement.
"""

from __future__ import annotations

import msgspec

from events.catalogue import LogEvent, NodeLeft, NodeTimedOut
from events.ids import InstanceId, NodeId
from events.state import State
from events.vocabulary import JoinCause

RunnerKey = tuple[InstanceId, int]


class RunnerPlan(msgspec.Struct, frozen=True, kw_only=True):
    start: list[RunnerKey]
    stop: list[RunnerKey]


def wanted_runners(state: State, node_id: NodeId) -> set[RunnerKey]:
    wanted: set[RunnerKey] = set()
    for instance in state.instances.values():
        if instance.retired:
            continue
        for shard in instance.shards:
            if shard.node_id == node_id:
                wanted.add((instance.instance_id, shard.rank))
    return wanted


def plan_runners(state: State, node_id: NodeId, running: set[RunnerKey], ever_started: set[RunnerKey]) -> RunnerPlan:
    wanted = wanted_runners(state, node_id)
    return RunnerPlan(
        start=sorted(wanted - running - ever_started),
        stop=sorted(running - wanted),
    )


def ranks_on_host(state: State, host: str) -> list[RunnerKey]:
    """Live ranks on every node at `host` (workers co-located on one machine share its cores), in
    one order every worker there reads alike: by instance id, then rank."""
    hosts = {n.node_id: n.host for n in state.nodes.values()}
    return sorted(
        (instance.instance_id, shard.rank)
        for instance in state.instances.values()
        if not instance.retired
        for shard in instance.shards
        if hosts.get(shard.node_id) == host
    )


def ranks_sharing_host(state: State, host: str) -> int:
    return len(ranks_on_host(state, host))


def host_rank_index(state: State, host: str, key: RunnerKey) -> int:
    """`key`'s place among the live ranks at `host` (0 when the state does not hold it)."""
    ranks = ranks_on_host(state, host)
    return ranks.index(key) if key in ranks else 0


def rejoin_cause(state: State, node_id: NodeId, event: LogEvent) -> JoinCause | None:
    """Why this worker, alive, must announce its node again after folding `event` into `state`:
    the log just said its node timed out (a pause, a partition, a slow link) or left (a stale
    incarnation's goodbye), and still says so. None otherwise. Only the worker brings its node
    back (see `NodeJoined`); the caller derives the announcement's id from `event`'s, so folding
    the same timeout twice (a restart, a replay) stores one re-announce."""
    match event:
        case NodeTimedOut() | NodeLeft() if event.node_id == node_id:
            node = state.nodes.get(node_id)
            if node is None or node.status == "up":
                return None
            return "timed_out" if isinstance(event, NodeTimedOut) else "left"
        case _:
            return None
