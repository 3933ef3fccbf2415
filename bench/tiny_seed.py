"""The tiny model, built once per machine and copied into each harness cluster's data dir.

`shoal up` serving `tiny` builds the model into its data dir when it is not there (about 2 s of
CPU: mlx, mlx-lm and the tokenizer's writer), and every cluster the suite and the benches start
has a data dir of its own. So the harness builds it once into a cache under the temp dir and
copies it in (a copy, not a link: a test may damage its cluster's files). The cache's name hashes
the generator's source and the mlx and mlx-lm versions (the model's own directory name, the spec),
so an edited generator or an upgrade builds anew rather than serving a stale model.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

from runner.models.tiny import TinySpec, built_tiny, tiny_dir

GENERATOR = Path(__file__).resolve().parents[1] / "runner" / "models"


def seed_tiny(data_dir: Path) -> Path:
    """`data_dir`'s tiny model, copied from the machine's cache (built there first if needed)."""
    spec = TinySpec()
    target = tiny_dir(data_dir / "models", spec)  # where `cached_tiny` looks
    if not (target / "model.safetensors").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        cache = Path(tempfile.gettempdir()) / f"shoal-harness-tiny-{_generator_digest()}"
        shutil.copytree(built_tiny(cache, spec), target, dirs_exist_ok=True)
    return target


def _generator_digest() -> str:
    digest = hashlib.sha256()
    for source in sorted(GENERATOR.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    digest.update(f"mlx {version('mlx')} mlx-lm {version('mlx-lm')}".encode())
    return digest.hexdigest()[:12]
