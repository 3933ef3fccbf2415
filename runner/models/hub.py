"""Models named by a Hugging Face Hub id (`owner/name`), resolved where their weights are read.

Every node has its own Hub cache (`HF_HOME` / `HF_HUB_CACHE`), so a rank resolves the id on its
own node: the cache first (`local_files_only`), then, only when downloads are allowed (the
`model_download` setting, and `HF_HUB_OFFLINE` unset), a download whose byte progress goes to a
callback (the runner publishes it on the bus). An id that is neither cached nor reachable is a
`ModelUnavailableError` whose message names the cache it looked in and how to fix it.

An id is checked for the Hub's `owner/name` shape before it reaches `huggingface_hub`, so a
reference such as `../x` or `a/../../b` is never joined into a cache path.
"""

from __future__ import annotations

import io
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.errors import ModelDirError

# One owner segment and one name segment: letters, digits, `_`, `-`, `.`; neither may start with
# `.` or `-`, and `..` / `--` are refused (the Hub refuses them too; `--` would also alias the
# cache's `models--owner--name` folder naming).
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,95}"
_HUB_ID = re.compile(rf"^{_SEGMENT}/{_SEGMENT}$")

# Called with (bytes done, bytes total) while a model downloads.
ProgressCallback = Callable[[int, int], None]


class ModelUnavailableError(ModelDirError):
    """A Hub id that is not in this node's cache and could not be downloaded."""


def is_hub_id(reference: str) -> bool:
    """Whether `reference` has the Hub's `owner/name` shape (and so is looked up in the Hub cache)."""
    return bool(_HUB_ID.match(reference)) and ".." not in reference and "--" not in reference


def hub_owner(reference: str) -> str | None:
    """The owner of a Hub id (`mlx-community` of `mlx-community/x`); None for anything else."""
    return reference.split("/", 1)[0] if is_hub_id(reference) else None


def hub_cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def cached_hub_models() -> list[str]:
    """The Hub models with weights in this node's cache (`owner/name`), servable without a download;
    none when the cache cannot be read."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    try:
        info = scan_cache_dir()
    except (CacheNotFound, CorruptedCacheException, OSError):
        return []
    return sorted(
        repo.repo_id
        for repo in info.repos
        if repo.repo_type == "model"
        and is_hub_id(repo.repo_id)
        and any(f.file_name.endswith(".safetensors") for rev in repo.revisions for f in rev.files)
    )


def downloads_possible(allowed: bool) -> bool:
    """The setting allows it and `HF_HUB_OFFLINE` does not forbid it."""
    from huggingface_hub import constants

    return allowed and not constants.HF_HUB_OFFLINE


def hub_unreachable(timeout_s: float = 5.0) -> str | None:
    """Why the Hub endpoint (`HF_ENDPOINT`) cannot be reached, or None when it answered or the
    probe could not tell (a slow network is left to huggingface_hub). One request, no retries:
    huggingface_hub retries a refused connection or a failed name lookup for ~23 s before it
    gives up, so an offline node would keep its user waiting for nothing. Proxies in the
    environment are honoured, as huggingface_hub honours them."""
    import httpx
    from huggingface_hub import constants

    try:
        httpx.head(constants.ENDPOINT, timeout=timeout_s, trust_env=True)
    except httpx.ConnectError as exc:
        return f"the Hub at {constants.ENDPOINT} cannot be reached ({exc or type(exc).__name__})"
    except httpx.HTTPError:
        return None
    return None


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of `repo_id` on this node (its `refs/main`), or None; never touches the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError:
        return None


def hub_snapshot(repo_id: str, *, allow_download: bool, progress: ProgressCallback | None = None) -> Path:
    """The directory of `repo_id`'s files on this node: cached, else downloaded (when allowed)."""
    cached = cached_snapshot(repo_id)
    if cached is not None:
        return cached
    if not downloads_possible(allow_download):
        raise unavailable(repo_id, "downloads are off (model_download false or HF_HUB_OFFLINE set)")
    unreachable = hub_unreachable()
    if unreachable is not None:
        raise unavailable(repo_id, unreachable)
    from huggingface_hub import snapshot_download

    try:
        bar: Any = reporting_bar_class(progress) if progress is not None else None
        return Path(snapshot_download(repo_id, tqdm_class=bar))
    except Exception as exc:  # every way a download fails (network, auth, missing repo) says the same to the user
        raise unavailable(repo_id, f"the download failed: {_first_line(exc)}") from exc


def hub_config(repo_id: str, *, allow_download: bool) -> Path:
    """`config.json` of `repo_id` alone (a few KB): what the master reads a layer count from."""
    from huggingface_hub import hf_hub_download

    online = downloads_possible(allow_download)
    unreachable = hub_unreachable() if online else None  # then the cached copy, if any, is read at once
    try:
        return Path(hf_hub_download(repo_id, "config.json", local_files_only=not online or unreachable is not None))
    except Exception as exc:  # as above: any failure means the model cannot be placed
        why = unreachable or f"its config.json could not be read: {_first_line(exc)}"
        raise unavailable(repo_id, why) from exc


def _first_line(exc: Exception) -> str:
    """huggingface_hub's messages run to paragraphs; the first line names the cause."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(":. ")


def unavailable(repo_id: str, why: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"model {repo_id!r} is neither in the Hugging Face cache ({hub_cache_dir()}) nor downloadable: {why}. "
        f"Fix: run `hf download {repo_id}` on every node (or point HF_HOME/HF_HUB_CACHE at a "
        "cache that has it), or allow downloads (model_download true, HF_HUB_OFFLINE unset) on a node with network"
    )


class ProgressThrottle:
    """Lets a progress report through at most every `interval_s` seconds, and always the last one
    (done == total): a download's progress reaches the bus at a bounded rate."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: float | None = None

    def due(self, done: int, total: int) -> bool:
        now = self.clock()
        if (total and done >= total) or self._last is None or now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


def reporting_bar_class(report: ProgressCallback) -> type[Any]:
    """A tqdm class for `snapshot_download(tqdm_class=...)` that calls `report(done, total)` as
    bytes arrive. huggingface_hub instantiates it for its byte bars and for its file-count bar;
    only byte bars report (the transfer bar of Xet downloads repeats the bytes, so it is skipped)."""
    from tqdm.auto import tqdm

    class ReportingBar(tqdm):  # pyright: ignore[reportUntypedBaseClass]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("name", None)
            super().__init__(*args, **{**kwargs, "disable": False, "file": io.StringIO()})  # pyright: ignore[reportUnknownMemberType]

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
            if self.unit == "B" and not str(self.desc).startswith("Downloading bytes"):  # pyright: ignore[reportUnknownMemberType]
                report(int(self.n), int(self.total or 0))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
            return shown  # pyright: ignore[reportUnknownVariableType]

    return ReportingBar
