"""Placement as a pure function: which nodes host which layers, and on which ring ports.

Layers are split in proportion to each node's memory, with at least one layer per node, so a
bigger node carries more of the model. Ports are the lowest free ones at or above the base on
each host, given the instances still alive there and the model's newest placements that never got
ready: a port another program holds (a long-lived connection's ephemeral port, say) fails every
placement that takes it, so the next attempt takes other ones.
"""

from __future__ import annotations

import hashlib
import itertools
import re

import msgspec

from events.catalogue import Shard
from events.ids import InstanceId, NodeId
from events.state import InstanceInfo, NodeInfo, State
from services.supervise import Backoff

# Below every common kernel's ephemeral range (Linux 32768-60999, macOS and Windows 49152-65535), so an
# outgoing connection's port is never where the master looks first.
DEFAULT_RING_BASE_PORT = 29100


class PlacementError(Exception):
    """A model cannot be placed on the nodes that are up; the message says why and what to do."""


class PlannedInstance(msgspec.Struct, frozen=True, kw_only=True):
    instance_id: InstanceId
    shards: list[Shard]
    ring_hosts: list[str]


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


def plan_instance(state: State, model: str, layers: int, *, base_port: int, max_nodes: int) -> PlannedInstance:
    nodes = nodes_up(state)[:max_nodes]
    if not nodes:
        raise PlacementError("no worker node has joined: start one with `shoal worker` (or `shoal up`)")
    nodes = nodes[: min(len(nodes), layers)]
    ranges = split_layers(layers, [n.memory_bytes for n in nodes])
    taken = used_ports(state)
    for host, ports in ports_of_failed_placements(state, model).items():
        taken.setdefault(host, set()).update(ports)
    ring_hosts: list[str] = []
    for node in nodes:
        host_taken = taken.setdefault(node.host, set())
        port = base_port
        while port in host_taken:
            port += 1
        host_taken.add(port)
        ring_hosts.append(f"{node.host}:{port}")
    shards = [
        Shard(node_id=NodeId(node.node_id), rank=rank, start_layer=start, end_layer=end)
        for rank, (node, (start, end)) in enumerate(zip(nodes, ranges, strict=True))
    ]
    instance_id = InstanceId(f"inst-{model_slug(model)}-{generation(state, model)}")
    return PlannedInstance(instance_id=instance_id, shards=shards, ring_hosts=ring_hosts)


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
    or before the newest node (re)joined (new capacity is worth a new attempt)."""
    joined_at = max((n.changed_at for n in nodes_up(state)), default=0)
    counted = list(
        itertools.takewhile(
            lambda instance: instance.placed_seq > after_seq and instance.placed_at >= joined_at,
            _failure_streak(state, model),
        )
    )
    if not counted:
        return PlacementFailures()
    newest = counted[0]
    return PlacementFailures(count=len(counted), last_at=newest.retired_at, last_reason=newest.retire_reason)


def _stopped(instance: InstanceInfo) -> bool:
    return instance.retire_cause == "node_gone" or any(r.cause == "terminated" for r in instance.runners)


def refusal(model: str, failures: PlacementFailures, policy: RetryPolicy) -> str:
    """What a refused model's tasks, `shoal up`, `/healthz` and `/v1/models` say."""
    retry = policy.delay_ns(failures.count) / 1e9
    return (
        f"refused: model {model!r} failed to load {failures.count} times in a row "
        f"(last: {failures.last_reason}); the master retries it {retry:g}s after the last failure"
    )
