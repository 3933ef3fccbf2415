"""The fold rules of the model events (downloads, unavailability, operators' load and unload
requests), kept apart from `apply.py`'s cluster and task rules. A model needs no introducing event: the first event
about it creates its `ModelStatus`. A download report is recorded under its node whether or not
that node's `NodeJoined` is still in the log (retention may have trimmed it): the report itself is
the fact a reader wants.
"""

from __future__ import annotations

import msgspec

from events.catalogue import ModelDownloadProgress, ModelLoadRequested, ModelUnavailable, ModelUnloadRequested
from events.state import DownloadProgress, ModelStatus, State

replace = msgspec.structs.replace


def model_download_progress(state: State, seq: int, event: ModelDownloadProgress) -> State:
    status = state.models.get(event.model) or ModelStatus(model=event.model)
    report = DownloadProgress(bytes_done=event.bytes_done, bytes_total=event.bytes_total, at=event.env.wall_time)
    updated = replace(status, downloads={**status.downloads, event.node_id: report})
    return replace(state, last_seq=seq, models=state.models.set(event.model, updated))


def model_unavailable(state: State, seq: int, event: ModelUnavailable) -> State:
    status = state.models.get(event.model) or ModelStatus(model=event.model)
    updated = replace(status, unavailable=event.error, unavailable_at=event.env.wall_time)
    return replace(state, last_seq=seq, models=state.models.set(event.model, updated))


def model_load_requested(state: State, seq: int, event: ModelLoadRequested) -> State:
    status = state.models.get(event.model) or ModelStatus(model=event.model)
    updated = replace(status, pinned=event.pinned, load_requested_seq=seq, hints=event.hints)
    return replace(state, last_seq=seq, models=state.models.set(event.model, updated))


def model_unload_requested(state: State, seq: int, event: ModelUnloadRequested) -> State:
    status = state.models.get(event.model) or ModelStatus(model=event.model)
    updated = replace(status, pinned=False, unload_requested_seq=seq)
    return replace(state, last_seq=seq, models=state.models.set(event.model, updated))
