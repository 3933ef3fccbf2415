"""`shoal placement explain MODEL`: why each instance of a model sits where it does, from the log.

Pure over a folded State: every instance of the model in the order it was placed, with the nodes
and layers it took, the memory placement reserved on each, the master's reason for that choice,
and how it ended (for an instance retired: the cause and reason); then what each node that is up
has left, so an operator sees what a new placement could take."""

from __future__ import annotations

from events.state import InstanceInfo, State
from services.master.capacity import in_gib, rooms
from services.master.lifecycle import draining


def explain_placement(state: State, model: str) -> list[str]:
    instances = sorted((i for i in state.instances.values() if i.model == model), key=lambda i: i.placed_seq)
    status = state.models.get(model)
    lines = [f"model {model!r}: {len(instances)} instance(s) placed since the log began"]
    if status is not None and status.pinned:
        lines.append("  pinned by an operator: never unloaded for idleness nor evicted")
    if status is not None and status.unavailable:
        lines.append(f"  the master could not place it: {status.unavailable}")
    for instance in instances:
        lines += _instance_lines(state, instance)
    room = rooms(state)
    lines.append("nodes up now (free = budget less what live instances reserve; hosts shared by several nodes):")
    for node in sorted(room.nodes.values(), key=lambda n: n.node_id):
        host = room.hosts[node.host]
        lines.append(
            f"  {node.node_id} on {node.host}: {in_gib(node.free)} free of {in_gib(node.budget)} "
            f"(host {in_gib(host.free)} free of {in_gib(host.capacity)})"
        )
    return lines


def _instance_lines(state: State, instance: InstanceInfo) -> list[str]:
    shards = ", ".join(
        f"rank {s.rank} on {s.node_id} layers {s.start_layer}-{s.end_layer - 1} ({in_gib(s.memory_bytes)})"
        for s in sorted(instance.shards, key=lambda s: s.rank)
    )
    if instance.retired:
        now = f"retired ({instance.retire_cause or 'unknown cause'}): {instance.retire_reason}"
    elif draining(state, instance):
        now = f"draining: unloaded by an operator, finishing {len(instance.queue)} task(s)"
    else:
        now = f"{'ready' if instance.ready else 'loading'}, holding {len(instance.queue)} task(s)"
    return [
        f"- {instance.instance_id} (seq {instance.placed_seq}): {shards}",
        f"    why: {instance.placement_reason or 'not recorded (placed before placement explained itself)'}",
        f"    now: {now}",
    ]
