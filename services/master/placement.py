"""Placement as a pure function: which nodes host which layers, and on which ring ports.

An instance goes on the fewest nodes whose free memory (`capacity.py`) holds the model's weights
and its KV room, the nodes with the most free memory first; layers are split in proportion to what
each chosen node can take, at least one layer per node, so a bigger node carries more of the
model. Ports are the lowest free ones at or above the base on
each host, given the instances still alive there and the model's newest placements that never got
ready: a port another program holds (a long-lived connection's ephemeral port, say) fails every
placement that takes it, so the next attempt takes other ones.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Collection

import msgspec

from events.catalogue import Shard
from events.ids import InstanceId, NodeId
from events.state import InstanceInfo, NodeInfo, State
from services.master.capacity import ModelFacts, Rooms, in_gib, rooms, shard_bytes
from services.master.ring import ring_order
from services.supervise import Backoff

# Below every common kernel's ephemeral range (Linux 32768-60999, macOS and Windows 49152-65535), so an
# outgoing connection's port is never where the master looks first.
DEFAULT_RING_BASE_PORT = 29100


class PlacementError(Exception):
    """A model cannot be placed on the nodes that are up; the message says why and what to do."""


class PlannedInstance(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: InstanceId
    model: str
    shards: list[Shard]
    ring_hosts: list[str]
    reason: str = ""  # why these nodes, for `shoal placement explain`


def split_layers(layers: int, weights: list[int]) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges, one per weight, sizes proportional to weight, each >= 1."""
    if not weights:
        raise PlacementError("no nodes to place on")
    if layers < len(weights):
        raise PlacementError(f"the model has {layers} layers, fewer than the {len(weights)} nodes to split it over")
    total = sum(max(w, 1) for w in weights)
    sizes = [1] * len(weights)
    spare = layers - len(weights)
    # Largest-remainder apportionment of the spare layers (deterministic: ties go to the lower rank).
    quotas = [spare * max(w, 1) / total for w in weights]
    for i, q in enumerate(quotas):
        sizes[i] += int(q)
    leftover = layers - sum(sizes)
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - int(quotas[i])), i))
    for i in by_remainder[:leftover]:
        sizes[i] += 1
    ranges: list[tuple[int, int]] = []
    start = 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return ranges


def model_slug(model: str) -> str:
    """A subject-safe, stable token for a model name or path."""
    tail = re.sub(r"[^A-Za-z0-9_-]+", "-", model.rstrip("/").split("/")[-1]).strip("-")[:24] or "model"
    digest = hashlib.sha1(model.encode()).hexdigest()[:6]
    return f"{tail}-{digest}"


def generation(state: State, model: str) -> int:
    """How many instances of this model were ever placed (the next one's number)."""
    return sum(1 for inst in state.instances.values() if inst.model == model)


def used_ports(state: State) -> dict[str, set[int]]:
    used: dict[str, set[int]] = {}
    for inst in state.instances.values():
        if inst.retired:
            continue
        for host, port in _host_ports(inst):
            used.setdefault(host, set()).add(port)
    return used


FAILED_PORTS_REMEMBERED = 8  # placements in the failure streak whose ports the next one avoids


def ports_of_failed_placements(state: State, model: str) -> dict[str, set[int]]:
    """The ring ports of the model's newest placements in a row that never got ready (at most
    `FAILED_PORTS_REMEMBERED` of them, so a model failing for another reason never walks its ports
    far from the base). One ready placement ends the streak, and its ports are free again."""
    avoided: dict[str, set[int]] = {}
    for instance in _failure_streak(state, model)[:FAILED_PORTS_REMEMBERED]:
        for host, port in _host_ports(instance):
            avoided.setdefault(host, set()).add(port)
    return avoided


def _failure_streak(state: State, model: str) -> list[InstanceInfo]:
    """The model's retired placements that never got ready, newest first, up to the newest one that
    did (or is still alive); stopped ones are skipped, as in `placement_failures`."""
    streak: list[InstanceInfo] = []
    for instance in sorted(state.instances.values(), key=lambda i: -i.placed_seq):
        if instance.model != model or _stopped(instance):
            continue
        if instance.became_ready_at or not instance.retired:
            break
        streak.append(instance)
    return streak


def _host_ports(instance: InstanceInfo) -> list[tuple[str, int]]:
    pairs: list[tuple[str, int]] = []
    for host_port in instance.ring_hosts:
        host, _, port = host_port.rpartition(":")
        pairs.append((host, int(port)))
    return pairs


def nodes_up(state: State) -> list[NodeInfo]:
    return sorted((n for n in state.nodes.values() if n.status == "up"), key=lambda n: n.node_id)


class NodeCount(msgspec.Struct, frozen=True, kw_only=True):
    """How many nodes an instance may be split over: the policy's bounds, narrowed by an
    operator's hints (`shoal models load --min-nodes/--max-nodes/--node`)."""

    least: int = 1
    most: int = 8


class PlacementRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    facts: ModelFacts
    count: NodeCount = NodeCount()
    only_nodes: tuple[NodeId, ...] = ()  # empty = any node that is up
    kv_reserve_fraction: float = 0.25
    base_port: int = DEFAULT_RING_BASE_PORT


class NoRoom(PlacementError):
    """The nodes that are up do not have the free memory the model needs (idle instances could be
    evicted to make room; the core tries that)."""


def plan_instance(state: State, request: PlacementRequest, *, without: Collection[InstanceId] = ()) -> PlannedInstance:
    """The fewest nodes whose free memory holds the model and its KV room, at least
    `request.count.least` of them (or every node up, when fewer are): the nodes with the most free memory first, layers split in
    proportion to what each can take. Instances in `without` count as gone (being evicted)."""
    candidates = [n for n in nodes_up(state) if not request.only_nodes or n.node_id in request.only_nodes]
    if not candidates:
        if request.only_nodes:
            raise PlacementError(f"none of the nodes {', '.join(request.only_nodes)} is up")
        raise PlacementError("no worker node has joined: start one with `shoal worker` (or `shoal up`)")
    room = rooms(state, without=without)
    by_free = sorted(candidates, key=lambda n: (-room.nodes[n.node_id].free, n.node_id))
    most = min(request.count.most, len(by_free), request.facts.layers)
    least = min(request.count.least, most)  # with fewer nodes up than asked, all of them
    for count in range(least, most + 1):
        chosen, ring_us = ring_order(by_free[:count])
        split = _fitting_split(room, chosen, request)
        if split is not None:
            why = _why(room, chosen, split, request)
            if ring_us is not None and count >= 3:
                why += f"; ring ordered by measured round trips ({ring_us / 1000:.2f} ms around)"
            return _planned(state, request, chosen, split, why)
    raise NoRoom(_no_room(room, by_free[:most], request))


def _fitting_split(room: Rooms, chosen: list[NodeInfo], request: PlacementRequest) -> list[tuple[int, int]] | None:
    """Layers for each chosen node in proportion to what it can take, or None when a node's share
    does not fit in it."""
    free = room.effective_free(n.node_id for n in chosen)
    weights = [free[n.node_id] for n in chosen]
    if min(weights) <= 0:
        return None
    split = split_layers(request.facts.layers, weights)
    for node, (start, end) in zip(chosen, split, strict=True):
        if shard_bytes(request.facts, end - start, request.kv_reserve_fraction) > free[node.node_id]:
            return None
    return split


def _planned(
    state: State, request: PlacementRequest, chosen: list[NodeInfo], split: list[tuple[int, int]], reason: str
) -> PlannedInstance:
    taken = used_ports(state)
    for host, ports in ports_of_failed_placements(state, request.model).items():
        taken.setdefault(host, set()).update(ports)
    ring_hosts: list[str] = []
    for node in chosen:
        host_taken = taken.setdefault(node.host, set())
        port = request.base_port
        while port in host_taken:
            port += 1
        host_taken.add(port)
        ring_hosts.append(f"{node.host}:{port}")
    shards = [
        Shard(
            node_id=NodeId(node.node_id),
            rank=rank,
            start_layer=start,
            end_layer=end,
            memory_bytes=shard_bytes(request.facts, end - start, request.kv_reserve_fraction),
        )
        for rank, (node, (start, end)) in enumerate(zip(chosen, split, strict=True))
    ]
    instance_id = InstanceId(f"inst-{model_slug(request.model)}-{generation(state, request.model)}")
    return PlannedInstance(
        instance_id=instance_id, model=request.model, shards=shards, ring_hosts=ring_hosts, reason=reason
    )


def _why(room: Rooms, chosen: list[NodeInfo], split: list[tuple[int, int]], request: PlacementRequest) -> str:
    need = shard_bytes(request.facts, request.facts.layers, request.kv_reserve_fraction)
    held = ", ".join(
        f"{node.node_id} layers {start}-{end - 1} ({in_gib(room.nodes[node.node_id].free)} free)"
        for node, (start, end) in zip(chosen, split, strict=True)
    )
    if len(chosen) == 1:
        because = "the fewest nodes that hold it"
    elif len(chosen) <= request.count.least:
        because = f"split over {len(chosen)} nodes as asked (at least {request.count.least})"
    else:
        because = f"no {len(chosen) - 1} of the nodes up have the room together"
    return f"needs {in_gib(need)} (weights and KV room); {because}: {held}"


def _no_room(room: Rooms, largest: list[NodeInfo], request: PlacementRequest) -> str:
    need = shard_bytes(request.facts, request.facts.layers, request.kv_reserve_fraction)
    free = ", ".join(f"{n.node_id} {in_gib(room.nodes[n.node_id].free)}" for n in largest)
    return (
        f"cannot fit: model {request.model!r} needs {in_gib(need)} (weights and KV room) and the nodes up have "
        f"free: {free} (over at most {len(largest)} nodes); unload a model (`shoal models unload`), add a node, "
        "or raise node_memory_bytes"
    )


# --- failed placements: counted, backed off, retried ---------------------------------------------


class PlacementFailures(msgspec.Struct, frozen=True, kw_only=True):
    """The model's placements in a row that never got ready for a reason of its own (see
    `placement_failures`), newest first: how many, when the newest was retired, and why."""

    count: int = 0
    last_at: int = 0  # wall ns of the newest one's retirement
    last_reason: str = ""


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How failed placements of a model are retried: after a backoff of 2 s doubling per failure
    in a row up to 5 min; from `refuse_after` failures in a row on, tasks for the model are refused
    (failed at once, saying so) instead of waiting for the next attempt."""

    backoff: Backoff = Backoff(initial_seconds=2.0, max_seconds=300.0)
    refuse_after: int = 3

    def delay_ns(self, failures: int) -> int:
        return int(self.backoff.delay(failures) * 1e9)

    def due(self, failures: PlacementFailures, now_ns: int) -> bool:
        """Whether the next attempt may be placed at `now_ns`."""
        return now_ns >= failures.last_at + self.delay_ns(failures.count)

    def refused(self, failures: PlacementFailures) -> bool:
        return failures.count >= self.refuse_after


def placement_failures(state: State, model: str, *, after_seq: int = 0) -> PlacementFailures:
    """Retired instances of `model` in a row (newest first) that never got ready and were not
    stopped: a node leaving (a worker shut down, a machine gone) or a rank told to stop is not the
    model's fault, and neither is anything before `after_seq` (a fresh master forgives the past)
    or before the newest node (re)joined (new capacity is worth a new attempt). "Before" is the
    log's order: a join's stamp is its worker's clock, a placement's the master's, and a worker
    whose clock ran ahead made every placement look older than its join (no backoff, no refusal)."""
    joined_seq = max((n.changed_seq for n in nodes_up(state)), default=0)
    counted = list(
        itertools.takewhile(
            lambda instance: instance.placed_seq > max(after_seq, joined_seq),
            _failure_streak(state, model),
        )
    )
    if not counted:
        return PlacementFailures()
    newest = counted[0]
    return PlacementFailures(count=len(counted), last_at=newest.retired_at, last_reason=newest.retire_reason)


# Retirements that say nothing about the model: its node went away, or it was unloaded on purpose.
_STOPS: frozenset[str] = frozenset({"node_gone", "idle", "evicted", "unloaded", "moved"})


def _stopped(instance: InstanceInfo) -> bool:
    return instance.retire_cause in _STOPS or any(r.cause == "terminated" for r in instance.runners)


def refusal(model: str, failures: PlacementFailures, policy: RetryPolicy) -> str:
    """What a refused model's tasks, `shoal up`, `/healthz` and `/v1/models` say."""
    retry = policy.delay_ns(failures.count) / 1e9
    return (
        f"refused: model {model!r} failed to load {failures.count} times in a row "
        f"(last: {failures.last_reason}); the master retries it {retry:g}s after the last failure"
    )
