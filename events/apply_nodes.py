"""The fold rules of `NodeJoined` and `LinkMeasured`, kept apart from `apply.py`: a node is up whenever its worker
announces it, at start or coming back from a timeout or a leave (see `NodeJoined`); the outage it
comes back from stays in its `NodeInfo.last_outage`, so a task that outage failed is still
blamed on the node once it is up again (`events.culprit`).
"""

from __future__ import annotations

import msgspec

from events.catalogue import LinkMeasured, NodeJoined
from events.state import LinkInfo, NodeInfo, NodeOutage, State


def node_joined(state: State, seq: int, event: NodeJoined) -> State:
    """Up, with the facts it announces now (a restarted node may have more memory, a new host)."""
    node = NodeInfo(
        node_id=event.node_id,
        host=event.host,
        cores=event.cores,
        memory_bytes=event.memory_bytes,
        host_memory_bytes=event.host_memory_bytes or event.memory_bytes,
        cached_models=tuple(event.cached_models),
        link_probe_port=event.link_probe_port,
        runner_logs=event.runner_logs,
        backend=event.backend,
        version=event.version,
        changed_at=event.env.wall_time,
        changed_seq=seq,
        last_outage=_outage_ended(state.nodes.get(event.node_id), event.env.wall_time, seq),
    )
    return msgspec.structs.replace(state, last_seq=seq, nodes=state.nodes.set(node.node_id, node))


def _outage_ended(before: NodeInfo | None, back_at: int, back_seq: int) -> NodeOutage | None:
    """The outage a join ends; a join of a node already up (a reconnect) keeps the last one."""
    if before is None:
        return None
    if before.status == "up":
        return before.last_outage
    return NodeOutage(
        status=before.status,
        reason=before.reason,
        at=before.changed_at,
        back_at=back_at,
        at_seq=before.changed_seq,
        back_seq=back_seq,
    )


def link_measured(state: State, seq: int, event: LinkMeasured) -> State:
    """The node's measurement of its link to a peer; a node not in the State (trimmed by retention,
    or announced after) keeps nothing: it measures again after it joins."""
    node = state.nodes.get(event.node_id)
    if node is None:
        return msgspec.structs.replace(state, last_seq=seq)
    link = LinkInfo(rtt_us=event.rtt_us, bytes_per_second=event.bytes_per_second, at=event.env.wall_time)
    updated = msgspec.structs.replace(node, links={**node.links, event.peer: link})
    return msgspec.structs.replace(state, last_seq=seq, nodes=state.nodes.set(node.node_id, updated))
