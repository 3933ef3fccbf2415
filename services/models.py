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
from runner.models.model_info import estimated_weight_bytes, layer_count, read_config, read_model_info, weight_bytes
from services.master.capacity import ModelFacts
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
    """What placement needs of a model (its layer count and weight bytes), read on this machine.

    Never builds a model: the master looks models up in a thread (`LookedUpCatalog`), and the
    tiny model's facts are known from its spec until it is built. A Hub model's config.json is read
    from the cache, and fetched alone when it is not there; its weights' bytes are summed from the
    cached files, else estimated from that config. Which models may be served is the API's and the
    operator's word (`served_models`), not this catalog's."""

    def __init__(self, *, allow_download: bool = True) -> None:
        self.allow_download = allow_download

    def facts_of(self, model: str) -> ModelFacts:
        try:
            if model == "tiny":
                return self._tiny()
            if is_hub_model(model):
                cached = cached_snapshot(model)
                if cached is not None and any(cached.glob("*.safetensors")):
                    return self._directory(cached)
                config_path = hub_config(model, allow_download=self.allow_download)
                config = read_config(config_path)
                return ModelFacts(
                    layers=layer_count(config, config_path.parent), weight_bytes=estimated_weight_bytes(config)
                )
            return self._directory(Path(model).expanduser())
        except ModelUnavailableError as exc:  # its message already names the model and the fix
            raise UnknownModel(str(exc)) from exc
        except (ModelDirError, OSError) as exc:  # OSError: a config file that cannot be read
            raise UnknownModel(f"model {model!r} cannot be loaded: {exc}") from exc

    def _tiny(self) -> ModelFacts:
        built = existing_model_dir("tiny")
        if built is not None:
            return self._directory(built)
        from runner.models.tiny import TinySpec, model_config

        spec = TinySpec()
        return ModelFacts(layers=spec.layers, weight_bytes=estimated_weight_bytes(model_config(spec, eos_ids=[])))

    @staticmethod
    def _directory(path: Path) -> ModelFacts:
        info = read_model_info(path)
        return ModelFacts(layers=info.n_layers, weight_bytes=weight_bytes(path))


def served_models(configured: Sequence[str], state: State) -> list[str]:
    """The models a cluster offers: the configured ones, those an operator loaded (even when
    unloaded since: a request places them again), any with a live instance, and the Hub models in
    the cache of a node that is up (placed on their first request)."""
    loaded = [m for m, status in state.models.items() if status.load_requested_seq]
    live = [i.model for i in state.instances.values() if not i.retired]
    cached = {m for node in state.nodes.values() if node.status == "up" for m in node.cached_models}
    return list(dict.fromkeys([*configured, *sorted(loaded), *sorted(live), *sorted(cached)]))


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
