"""Where `shoal.yaml` is and what it holds: `--config FILE`, else `$SHOAL_CONFIG`, else
`./shoal.yaml` (docs/ARCHITECTURE.md §10); a file that cannot be read is a `ConfigError`. And
whether the data dir can hold what shoal keeps there."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from services.config_values import ConfigError


def find_yaml(explicit: str | None, env: Mapping[str, str]) -> Path | None:
    if explicit:
        return Path(explicit).expanduser()
    from_env = env.get("SHOAL_CONFIG")
    if from_env:
        return Path(from_env).expanduser()
    local = Path("shoal.yaml")
    return local if local.is_file() else None


def read_yaml(path: Path) -> dict[str, object]:
    source = f"{path}"
    try:
        loaded: object = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError("config", str(path), "--config / SHOAL_CONFIG", "an existing YAML file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("config", str(path), source, f"a UTF-8 text file ({exc})") from exc
    except yaml.YAMLError as exc:
        raise ConfigError("config", str(path), source, f"valid YAML ({exc})") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("config", str(path), source, "a YAML mapping of setting: value")
    mapping: dict[Any, Any] = loaded  # pyright: ignore[reportUnknownVariableType]
    return {str(key): value for key, value in mapping.items()}


def check_data_dir(data_dir: Path, source: str) -> None:
    """Create `data_dir` if needed and prove this user can write in it: the NATS store and the
    tiny model live there, and a traceback from deep inside either says less than this."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            "data_dir",
            str(data_dir),
            source,
            f"a directory this user can create and write in ({reason}); choose another with --data-dir / SHOAL_DATA_DIR",
        ) from exc
