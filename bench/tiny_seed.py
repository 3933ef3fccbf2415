"""The tiny model, built once per machine and copied into each harness cluster's data dir.

`shoal up` serving `tiny` builds the model into its data dir when it is not there (about 2 s of
CPU: mlx, mlx-lm and the tokenizer's writer), and every cluster the suite and the benches start
has a data dir of its own. So the harness builds it once into a cache under the temp dir and
copies it in (a copy, not a link: a test may damage its cluster's files). The cache's name hashes
the spec, the generator's source and the mlx and mlx-lm versions, so an edited generator or an
upgrade builds anew rather than serving a stale model.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

from runner.models.tiny import TinySpec, make_tiny

GENERATOR = Path(__file__).resolve().parents[1] / "runner" / "models"


def seed_tiny(data_dir: Path) -> Path:
    """`data_dir`'s tiny model, copied from the machine's cache (built there first if needed)."""
    spec = TinySpec()
    target = data_dir / "models" / f"tiny-{spec.params_hash()}"  # where `cached_tiny` looks
    if not (target / "model.safetensors").exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(_built(spec), target, dirs_exist_ok=True)
    return target


def _built(spec: TinySpec) -> Path:
    cache = Path(tempfile.gettempdir()) / f"shoal-harness-tiny-{spec.params_hash()}-{_generator_digest()}"
    if (cache / "model.safetensors").exists():
        return cache
    staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
    try:
        make_tiny(staging, spec)
        with contextlib.suppress(OSError):  # another process won the race: its copy is the same
            staging.rename(cache)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cache


def _generator_digest() -> str:
    digest = hashlib.sha256()
    for source in sorted(GENERATOR.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    digest.update(f"mlx {version('mlx')} mlx-lm {version('mlx-lm')}".encode())
    return digest.hexdigest()[:12]
