"""One typed config for every service (docs/ARCHITECTURE.md §10): defaults < shoal.yaml < SHOAL_* env < CLI flags.

    resolved = resolve_config({"nats_url": "nats://h:4222"}, env=os.environ, yaml_path=None)
    resolved.config.nats_url        # the value
    resolved.sources["nats_url"]    # "default" | "shoal.yaml" | "env SHOAL_NATS_URL" | "cli --nats-url"

Every value remembers where it came from, so `shoal config show` and `GET /v1/config` report
exactly what the runtime uses. Invalid values are `ConfigError`s naming the key, the value, the
source and what is allowed; a value never falls back silently to its default. The YAML file is
`--config FILE`, else `$SHOAL_CONFIG`, else `./shoal.yaml` when it exists.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from eventlog.streams import LogSettings, StreamLimits

ENV_PREFIX = "SHOAL_"
ENV_NOT_SETTINGS = frozenset({"SHOAL_CONFIG"})  # SHOAL_* variables that are not settings
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
KV_BITS = (2, 3, 4, 6, 8)


class ShoalConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every setting of shoal, with its default. `nats_url` empty = run an embedded nats-server."""

    nats_url: str = ""
    nats_host: str = "127.0.0.1"
    nats_port: int = 4222
    data_dir: str = "~/.local/share/shoal"
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    model: str = "tiny"
    workers: int = 2
    prefill_step_size: int = 256
    kv_bits: int | None = None
    kv_group_size: int = 64
    max_tokens_limit: int = 4096
    max_prompt_tokens: int = 32768
    max_body_bytes: int = 1_000_000
    task_stall_seconds: float = 30.0
    node_timeout_seconds: float = 10.0
    heartbeat_interval_seconds: float = 1.0
    stall_stack_seconds: float = 5.0
    decode_cancel_poll_tokens: int = 8
    events_max_age_seconds: float = 7 * 86400.0
    events_max_bytes: int = 1 << 30
    telemetry_max_age_seconds: float = 3600.0
    stream_replicas: int = 1
    blas: str = "auto"
    log_level: str = "INFO"

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def client_nats_url(self) -> str:
        """Where clients connect: `nats_url`, else the embedded server at nats_host:nats_port."""
        if self.nats_url:
            return self.nats_url
        host = "127.0.0.1" if self.nats_host in ("0.0.0.0", "::") else self.nats_host
        return f"nats://{host}:{self.nats_port}"


KEYS: tuple[str, ...] = ShoalConfig.__struct_fields__
DEFAULTS = ShoalConfig()


class ConfigError(ValueError):
    """An invalid setting: names the key, the value, where it came from and what is allowed."""

    def __init__(self, key: str, value: object, source: str, allowed: str) -> None:
        super().__init__(f"invalid setting {key}={value!r} (from {source}): {allowed}")
        self.key = key
        self.value = value
        self.source = source
        self.allowed = allowed


class ResolvedConfig(msgspec.Struct, frozen=True, kw_only=True):
    config: ShoalConfig
    sources: dict[str, str]
    yaml_path: str | None = None

    def items(self) -> list[tuple[str, object, str]]:
        """(key, effective value, source) for every setting, in declaration order."""
        return [(key, getattr(self.config, key), self.sources[key]) for key in KEYS]

    def to_dict(self) -> dict[str, dict[str, object]]:
        """{key: {"value": v, "source": s}}: what `GET /v1/config` returns."""
        return {key: {"value": value, "source": source} for key, value, source in self.items()}


# --- value checks ----------------------------------------------------------------------------

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
Check = Callable[[Any], str | None]  # returns what is allowed when the value is not


def _int_range(low: int, high: int | None = None) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
            return f"an integer from {low}" + (f" to {high}" if high is not None else " up")
        return None

    return check


def _positive_float(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        return "a number of seconds greater than 0"
    return None


def _one_of(*allowed: object) -> Check:
    def check(value: Any) -> str | None:
        return None if value in allowed and not isinstance(value, bool) else f"one of {', '.join(map(str, allowed))}"

    return check


def _nonempty(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def _nats_url(value: Any) -> str | None:
    if not isinstance(value, str):
        return "a string"
    parts = [p.strip() for p in value.split(",")] if value else []
    if all(re.match(r"^(nats|tls|tcp)://[^\s/]+$", p) for p in parts):
        return None
    return "empty (run an embedded server) or nats://host:port, comma-separated for a cluster"


def _bytes_limit(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1024 and value != -1):
        return "a byte count of at least 1024, or -1 for unlimited"
    return None


CHECKS: dict[str, Check] = {
    "nats_url": _nats_url,
    "nats_host": _nonempty,
    "nats_port": _int_range(0, 65535),  # 0 = any free port (embedded server)
    "data_dir": _nonempty,
    "api_host": _nonempty,
    "api_port": _int_range(1, 65535),
    "model": _nonempty,
    "workers": _int_range(1, 64),
    "prefill_step_size": _int_range(1),
    "kv_bits": lambda v: None if v is None else _one_of(*KV_BITS)(v) and "none, 2, 3, 4, 6 or 8",
    "kv_group_size": _one_of(32, 64, 128),
    "max_tokens_limit": _int_range(1),
    "max_prompt_tokens": _int_range(1),
    "max_body_bytes": _int_range(1024),
    "task_stall_seconds": _positive_float,
    "node_timeout_seconds": _positive_float,
    "heartbeat_interval_seconds": _positive_float,
    "stall_stack_seconds": _positive_float,
    "decode_cancel_poll_tokens": _int_range(1),
    "events_max_age_seconds": _positive_float,
    "events_max_bytes": _bytes_limit,
    "telemetry_max_age_seconds": _positive_float,
    "stream_replicas": _int_range(1, 5),
    "blas": lambda v: _nonempty(v) and "auto, off, or the path of a BLAS library",
    "log_level": _one_of(*LOG_LEVELS),
}


def _field_type(key: str) -> Any:
    return ShoalConfig.__annotations__[key]


def parse_text(key: str, text: str, source: str) -> object:
    """A value from a string (env var, CLI flag), parsed strictly for the key's type."""
    kind = str(_field_type(key))
    raw = text.strip()
    if "None" in kind and raw.lower() in ("", "none", "null", "off"):
        return None
    if kind.startswith("int"):
        if not _INT.match(raw):
            raise ConfigError(key, text, source, "an integer" + (" or none" if "None" in kind else ""))
        return int(raw)
    if kind == "float":
        if not _FLOAT.match(raw):
            raise ConfigError(key, text, source, "a number such as 30 or 2.5")
        return float(raw)
    if kind == "bool":
        table = {
            "true": True,
            "1": True,
            "yes": True,
            "on": True,
            "false": False,
            "0": False,
            "no": False,
            "off": False,
        }
        if raw.lower() not in table:
            raise ConfigError(key, text, source, "true or false")
        return table[raw.lower()]
    return text


def _coerce(key: str, value: object, source: str) -> object:
    if isinstance(value, str) and str(_field_type(key)) != "str":
        value = parse_text(key, value, source)
    if key == "log_level" and isinstance(value, str):
        value = value.upper()
    if str(_field_type(key)) == "float" and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    problem = CHECKS[key](value)
    if problem:
        raise ConfigError(key, value, source, problem)
    return value


def _closest(name: str) -> str | None:
    matches = difflib.get_close_matches(name.lower(), KEYS, n=1, cutoff=0.75)
    return matches[0] if matches else None


def _unknown_key_error(key: str, value: object, source: str) -> ConfigError:
    near = _closest(key)
    hint = f"did you mean {near}?" if near else f"known settings: {', '.join(KEYS)}"
    return ConfigError(key, value, source, f"not a shoal setting; {hint}")


# --- resolution ------------------------------------------------------------------------------


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
    except yaml.YAMLError as exc:
        raise ConfigError("config", str(path), source, f"valid YAML ({exc})") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("config", str(path), source, "a YAML mapping of setting: value")
    mapping: dict[Any, Any] = loaded  # pyright: ignore[reportUnknownVariableType]
    return {str(key): value for key, value in mapping.items()}


def resolve_config(
    cli_overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    yaml_path: str | os.PathLike[str] | None = None,
) -> ResolvedConfig:
    """Merge defaults < YAML < SHOAL_* env < CLI overrides (key -> value; None = not given)."""
    env = os.environ if env is None else env
    values: dict[str, object] = {key: getattr(DEFAULTS, key) for key in KEYS}
    sources = dict.fromkeys(KEYS, "default")
    path = find_yaml(str(yaml_path) if yaml_path else None, env)
    if path is not None:
        for key, value in read_yaml(path).items():
            if key not in values:
                raise _unknown_key_error(key, value, f"{path.name} ({path})")
            values[key], sources[key] = _coerce(key, value, path.name), "shoal.yaml"
    for name, text in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key in values:
            values[key], sources[key] = _coerce(key, text, f"env {name}"), f"env {name}"
        elif _closest(key) is not None:
            raise _unknown_key_error(key, text, f"env {name}")
    for key, value in (cli_overrides or {}).items():
        if value is None:
            continue
        flag = f"cli --{key.replace('_', '-')}"
        if key not in values:
            raise _unknown_key_error(key, value, flag)
        values[key], sources[key] = _coerce(key, value, flag), flag
    return ResolvedConfig(config=ShoalConfig(**values), sources=sources, yaml_path=str(path) if path else None)  # pyright: ignore[reportArgumentType]


# --- CLI helpers -----------------------------------------------------------------------------


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` and `--nats-url URL`, shared by every command that needs the config."""
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (default: ./shoal.yaml)")
    parser.add_argument("--nats-url", default=None, help="NATS server URL (default: an embedded server)")


def add_setting_flag(parser: argparse.ArgumentParser, key: str, help_text: str) -> None:
    """A `--key-name` flag whose value overrides setting `key` (parsed like the env var)."""
    parser.add_argument(f"--{key.replace('_', '-')}", dest=key, default=None, help=help_text)


def config_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ResolvedConfig:
    """The resolved config for a parsed command line: every attribute named like a setting counts."""
    overrides = {key: getattr(args, key) for key in KEYS if getattr(args, key, None) is not None}
    return resolve_config(overrides, env=env, yaml_path=getattr(args, "config", None))


def configure_logging(config: ShoalConfig) -> None:
    """Send loguru's output to stderr at `log_level` (called by a command's handler, never at import)."""
    import sys

    from loguru import logger

    def to_stderr(message: str) -> None:  # looked up per message: survives sys.stderr being swapped
        sys.stderr.write(message)

    logger.remove()
    logger.add(to_stderr, level=config.log_level)


def log_settings(config: ShoalConfig) -> LogSettings:
    """The event log's stream settings from the config."""
    return LogSettings(
        events=StreamLimits(max_age_seconds=config.events_max_age_seconds, max_bytes=config.events_max_bytes),
        telemetry=StreamLimits(max_age_seconds=config.telemetry_max_age_seconds, max_bytes=256 << 20),
        replicas=config.stream_replicas,
    )
