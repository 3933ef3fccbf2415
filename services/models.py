"""Which models this cluster serves, and how many layers each has (for placement).

A model is named either `tiny` (the random-weight model shoal generates itself) or by an mlx-lm
model directory path. The layer count is read from the directory's config.json without MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from events.state import State
from runner.errors import ModelDirError
from runner.models.model_info import read_model_info
from services.master.core import UnknownModel


def resolve_model_dir(model: str) -> Path:
    """`tiny` -> the cached tiny model (made on first use); anything else is a directory."""
    from runner.models.tiny import resolve_model  # lazy: making the tiny model needs MLX

    return resolve_model(model)


def existing_model_dir(model: str) -> Path | None:
    """The model's directory if it is on this machine already; never builds anything."""
    if model == "tiny":
        from runner.models.tiny import TinySpec, data_dir

        path = data_dir() / "models" / f"tiny-{TinySpec().params_hash()}"
    else:
        path = Path(model).expanduser()
    return path if path.is_dir() else None


class LocalModelCatalog:
    """Models this deployment serves: the configured ones, resolved on the local filesystem.

    Never builds a model: the master calls it inside its event loop, where a slow step would
    stall the watchdog (the tiny model's layer count is known from its spec)."""

    def __init__(self, served: Sequence[str]) -> None:
        self.served = list(dict.fromkeys(served))

    def layers_of(self, model: str) -> int:
        if model not in self.served:
            raise UnknownModel(f"unknown model {model!r}; known models: {', '.join(self.served)}")
        if model == "tiny":
            from runner.models.tiny import TinySpec

            return TinySpec().layers
        try:
            return read_model_info(Path(model).expanduser()).n_layers
        except ModelDirError as exc:
            raise UnknownModel(f"model {model!r} cannot be loaded: {exc}") from exc


def served_models(configured: Sequence[str], state: State) -> list[str]:
    """The models a cluster offers: the configured ones plus any with a live instance."""
    live = [i.model for i in state.instances.values() if not i.retired]
    return list(dict.fromkeys([*configured, *sorted(live)]))
