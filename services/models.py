"""Which models this cluster serves, and how many layers each has (for placement).

A model is named `tiny` (the random-weight model shoal generates itself), by an mlx-lm model
directory path, or by a Hugging Face Hub id (`owner/name`, see runner/models/hub.py). The layer
count is read from the model's config.json without MLX; for a Hub id, from this machine's Hub
cache, or fetched alone (a few KB) when downloads are allowed. The weights themselves are
resolved by each rank on its own node.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from events.state import State
from runner.errors import ModelDirError
from runner.models.hub import ModelUnavailableError, cached_snapshot, hub_config, is_hub_id
from runner.models.model_info import layer_count, read_config, read_model_info
from services.master.core import UnknownModel
from services.master.placement import RetryPolicy, placement_failures, refusal


def prepare_tiny(model: str) -> None:
    """Build the tiny model if `model` is `tiny` (so runners never race to build it); any other
    model is resolved by the ranks where its weights are read."""
    if model == "tiny":
        from runner.models.tiny import cached_tiny  # lazy: making the tiny model needs MLX

        cached_tiny()


def is_hub_model(model: str) -> bool:
    """A Hub id that is not also the name of a directory here (a directory wins, as on the ranks)."""
    return is_hub_id(model) and not Path(model).expanduser().is_dir()


def existing_model_dir(model: str) -> Path | None:
    """The model's directory if it is on this machine already; never builds or downloads anything."""
    if model == "tiny":
        from runner.models.tiny import TinySpec, data_dir, tiny_dir

        path = tiny_dir(data_dir() / "models", TinySpec())
    elif is_hub_model(model):
        path = cached_snapshot(model)
        if path is None:
            return None
    else:
        path = Path(model).expanduser()
    return path if path.is_dir() else None


class LocalModelCatalog:
    """Models this deployment serves: the configured ones, resolved on the local filesystem.

    Never builds a model: the master calls it inside its event loop, where a slow step would
    stall the watchdog (the tiny model's layer count is known from its spec; a Hub model's
    config.json is read from the cache, and fetched only when it is not there)."""

    def __init__(self, served: Sequence[str], *, allow_download: bool = True) -> None:
        self.served = list(dict.fromkeys(served))
        self.allow_download = allow_download

    def layers_of(self, model: str) -> int:
        if model not in self.served:
            raise UnknownModel(f"unknown model {model!r}; known models: {', '.join(self.served)}")
        if model == "tiny":
            from runner.models.tiny import TinySpec

            return TinySpec().layers
        try:
            if is_hub_model(model):
                config_path = hub_config(model, allow_download=self.allow_download)
                return layer_count(read_config(config_path), config_path.parent)
            return read_model_info(Path(model).expanduser()).n_layers
        except ModelUnavailableError as exc:  # its message already names the model and the fix
            raise UnknownModel(str(exc)) from exc
        except (ModelDirError, OSError) as exc:  # OSError: a config file that cannot be read
            raise UnknownModel(f"model {model!r} cannot be loaded: {exc}") from exc


def served_models(configured: Sequence[str], state: State) -> list[str]:
    """The models a cluster offers: the configured ones plus any with a live instance."""
    live = [i.model for i in state.instances.values() if not i.retired]
    return list(dict.fromkeys([*configured, *sorted(live)]))


def model_error(state: State, model: str) -> str:
    """Why `model` is not being served, from the log; "" while an instance of it is live (loading
    or ready). The master's reason it cannot place it, else that it is refused after failed
    placements in a row (retried after a backoff), else the reason its newest instance was
    retired before it ever got ready (a rank could not resolve or load it)."""
    instances = sorted((i for i in state.instances.values() if i.model == model), key=lambda i: i.placed_seq)
    if any(not i.retired for i in instances):
        return ""
    status = state.models.get(model)
    if status is not None and status.unavailable:
        return status.unavailable
    failures, retry = placement_failures(state, model), RetryPolicy()
    if retry.refused(failures):
        return refusal(model, failures, retry)
    newest = instances[-1] if instances else None
    if newest is not None and not newest.became_ready_at:
        return f"the last attempt to load it failed: {newest.retire_reason}"
    return ""
