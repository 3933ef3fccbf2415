"""What a model reference names on this node: `tiny`, a directory, or a Hugging Face Hub id."""

from __future__ import annotations

from pathlib import Path

from runner.models.hub import ProgressCallback, hub_snapshot, is_hub_id
from runner.models.tiny import cached_tiny


def resolve_model(reference: str, *, allow_download: bool = True, progress: ProgressCallback | None = None) -> Path:
    """`tiny` -> the cached tiny model; an existing directory -> itself; an `owner/name` id -> its
    snapshot in this node's Hub cache (downloaded when allowed); anything else -> the path, which
    the loader then reports as missing. A directory wins over a Hub id of the same spelling."""
    if reference == "tiny":
        return cached_tiny()
    path = Path(reference).expanduser()
    if path.is_dir() or not is_hub_id(reference):
        return path
    return hub_snapshot(reference, allow_download=allow_download, progress=progress)
