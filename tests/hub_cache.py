"""A real Hugging Face Hub cache layout, built locally (no network): what `huggingface_hub` finds
with `local_files_only=True`, as a `huggingface-cli download` would have left it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"  # a commit hash, as refs/main holds one


def install_in_hub_cache(cache: Path, repo_id: str, source: Path) -> Path:
    """Copy the files of `source` into `cache` as the `main` snapshot of `repo_id`: blobs named by
    their hash, the snapshot's files linking to them, refs/main naming the snapshot. Its folder."""
    owner, name = repo_id.split("/")
    repo = cache / f"models--{owner}--{name}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(p for p in source.iterdir() if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot
