"""Memory as placement sees it, from the log alone: what each node and each host may hold, and
what the live instances placed there reserve. Pure.

A node's budget is what its worker announced (`NodeJoined.memory_bytes`: `node_memory_bytes`, else
the machine's memory). Several nodes may run on one machine (`shoal up` starts its workers on one
host): each announces the same physical memory (`host_memory_bytes`), and the reservations of all of
them count against it, so two workers never both promise one machine's memory. What an instance
reserves on a node is its shards' `memory_bytes`, decided when it was placed; a retired instance
reserves nothing (its runners exit).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import msgspec

from events.ids import InstanceId, NodeId
from events.state import InstanceInfo, NodeInfo, State

GIB = 1 << 30


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What placement needs to know about a model: its layers, and the bytes of its weights."""

    layers: int
    weight_bytes: int


class NodeRoom(msgspec.Struct, frozen=True, kw_only=True):
    node_id: NodeId
    host: str
    budget: int  # what shoal may place on the node
    reserved: int  # what live instances hold there

    @property
    def free(self) -> int:
        return max(0, self.budget - self.reserved)


class HostRoom(msgspec.Struct, frozen=True, kw_only=True):
    host: str
    capacity: int  # the machine's memory
    reserved: int  # what live instances hold on all its nodes

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.reserved)


class Rooms(msgspec.Struct, frozen=True, kw_only=True):
    nodes: dict[NodeId, NodeRoom]
    hosts: dict[str, HostRoom]

    def effective_free(self, node_ids: Iterable[NodeId]) -> dict[NodeId, int]:
        """What each of `node_ids` can take when they are used together: its own free memory, or,
        where the chosen nodes of one host together want more than the host has free, their
        shares of what it has, in proportion to their own."""
        chosen = list(node_ids)
        wanted_on: dict[str, int] = {}
        for node_id in chosen:
            node = self.nodes[node_id]
            wanted_on[node.host] = wanted_on.get(node.host, 0) + node.free
        free: dict[NodeId, int] = {}
        for node_id in chosen:
            node = self.nodes[node_id]
            host_free, wanted = self.hosts[node.host].free, wanted_on[node.host]
            free[node_id] = node.free if wanted <= host_free else node.free * host_free // wanted
        return free


def rooms(state: State, *, without: Collection[InstanceId] = ()) -> Rooms:
    """The nodes that are up and their hosts, with what the live instances (less `without`:
    instances about to be retired) reserve on each."""
    up = [node for node in state.nodes.values() if node.status == "up"]
    reserved_on: dict[NodeId, int] = {}
    for instance in live_instances(state):
        if instance.instance_id in without:
            continue
        for shard in instance.shards:
            reserved_on[shard.node_id] = reserved_on.get(shard.node_id, 0) + shard.memory_bytes
    nodes = {
        node.node_id: NodeRoom(
            node_id=node.node_id, host=node.host, budget=node.memory_bytes, reserved=reserved_on.get(node.node_id, 0)
        )
        for node in up
    }
    hosts: dict[str, HostRoom] = {}
    for node in up:
        before = hosts.get(node.host)
        capacity = max(_host_memory(node), before.capacity if before else 0)
        reserved = (before.reserved if before else 0) + reserved_on.get(node.node_id, 0)
        hosts[node.host] = HostRoom(host=node.host, capacity=capacity, reserved=reserved)
    return Rooms(nodes=nodes, hosts=hosts)


def live_instances(state: State) -> list[InstanceInfo]:
    return [i for i in state.instances.values() if not i.retired]


def _host_memory(node: NodeInfo) -> int:
    return node.host_memory_bytes or node.memory_bytes


def shard_bytes(facts: ModelFacts, layers: int, kv_reserve_fraction: float) -> int:
    """What a rank holding `layers` of the model's layers reserves: their share of the weights, and
    room for their KV cache and activations as a fraction of it."""
    weights = facts.weight_bytes * layers // max(facts.layers, 1)
    return int(weights * (1 + kv_reserve_fraction))


def in_gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"
