"""`/v1/models` from the State: each served model with its placement, readiness, downloads and
the reason it is not served. Pure; the route adds the context length it read from the model."""

from __future__ import annotations

from events.state import InstanceInfo, State
from runner.models.hub import hub_owner
from services.api.responses import DownloadCard, InstanceCard, InstanceState, ModelCard, ModelState, ShardCard
from services.master.lifecycle import draining, pinned, waiting_models
from services.models import is_hub_model, model_error

NS_PER_S = 1_000_000_000


def model_card(state: State, model: str, context_length: int | None) -> ModelCard:
    live = sorted(
        (i for i in state.instances.values() if i.model == model and not i.retired), key=lambda i: i.placed_seq
    )
    status = state.models.get(model)
    error = model_error(state, model)
    downloads = [
        DownloadCard(node_id=node_id, bytes_done=d.bytes_done, bytes_total=d.bytes_total)
        for node_id, d in sorted(status.downloads.items() if status is not None else [])
        if not d.finished
    ]
    return ModelCard(
        id=model,
        object="model",
        created=live[0].placed_at // NS_PER_S if live else 0,
        owned_by=(hub_owner(model) if is_hub_model(model) else None) or "shoal",
        context_length=context_length,
        ready=any(i.ready for i in live),
        instances=[_instance_card(state, i) for i in live],
        downloads=downloads,
        error=error or None,
        state=model_state(state, model, error),
        pinned=pinned(state, model),
    )


def model_state(state: State, model: str, error: str) -> ModelState:
    """Where `model` stands, from the log (see `ModelState`)."""
    live = [i for i in state.instances.values() if i.model == model and not i.retired]
    serving = [i for i in live if not draining(state, i)]
    if any(i.ready for i in serving):
        return "placed"
    if serving:
        return "loading"
    if live:
        return "draining"
    if error:
        return "cannot_fit" if error.startswith("cannot fit") else "unavailable"
    if model in waiting_models(state):
        return "waiting"
    if any(i.model == model for i in state.instances.values()):
        return "unloaded"
    return "not_loaded"


def _instance_card(state: State, instance: InstanceInfo) -> InstanceCard:
    shards = [
        ShardCard(
            node_id=s.node_id,
            rank=s.rank,
            start_layer=s.start_layer,
            end_layer=s.end_layer,
            memory_bytes=s.memory_bytes,
        )
        for s in sorted(instance.shards, key=lambda s: s.rank)
    ]
    instance_state: InstanceState = (
        "draining" if draining(state, instance) else "ready" if instance.ready else "loading"
    )
    return InstanceCard(
        instance_id=instance.instance_id,
        ready=instance.ready,
        shards=shards,
        state=instance_state,
        placement=instance.placement_reason,
        held=len(instance.queue),
    )
