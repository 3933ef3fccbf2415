"""One typed config for every service (docs/ARCHITECTURE.md §10): defaults < shoal.yaml < SHOAL_* env < CLI flags.

    resolved = resolve_config({"nats_url": "nats://h:4222"}, env=os.environ, yaml_path=None)
    resolved.config.nats_url        # the value
    resolved.sources["nats_url"]    # "default" | "shoal.yaml" | "env SHOAL_NATS_URL" | "cli --nats-url"

Every value remembers where it came from, so `shoal config show` and `GET /v1/config` report
exactly what the runtime uses. Each setting is declared once, on `ShoalConfig`: its type carries
its constraint and meaning (`Annotated[..., msgspec.Meta(...)]`), then its default; the
runners' settings are declared in `events/runner_settings.py` and offered here under the same
names and defaults. Every value, from any layer, is checked against its type
(`config_values.DeclaredFields`); an invalid one is a `ConfigError` naming the key, the value,
the source and what is allowed, and never falls back silently to its default. Values fine alone
but not together are refused the same way (`_refuse_nonsense`). The YAML file is `--config
FILE`, else `$SHOAL_CONFIG`, else `./shoal.yaml` when it exists.
"""

from __future__ import annotations

import argparse
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, cast

import msgspec
from msgspec import Meta

from eventlog.endpoint import IDENTITY_ENV, NatsEndpoint
from eventlog.streams import LogSettings, StreamLimits
from eventlog.tls import TlsFiles
from events.runner_settings import (
    POSITIVE_SECONDS,
    BatchChunkEventsPerRound,
    HeartbeatIntervalSeconds,
    KvBits,
    KvCacheBytes,
    KvGroupSize,
    MaxBatch,
    ModelDownload,
    PrefillStepSize,
    PrefixCacheBytes,
    PublishBacklogEvents,
    RunnerSettings,
    StallStackSeconds,
    StreamChunkMinIntervalSeconds,
)
from events.state import FINISHED_TASKS_KEPT
from runner.affinity import PinRunnerThreads
from runner.blas import BlasSetting
from services.config_files import find_yaml, read_yaml
from services.config_values import REDACTED, ConfigError, DeclaredFields
from services.master.lease import DEFAULT_LEASE_SECONDS
from services.master.placement import DEFAULT_RING_BASE_PORT
from services.nats_durability import JETSTREAM_SYNC_INTERVAL, SyncInterval
from services.worker.runner_logs import RUNNER_LOG_BYTES, RUNNER_LOG_BYTES_LEAST

ENV_PREFIX = "SHOAL_"
# SHOAL_* variables that are not settings (SHOAL_ADMIN_KEY: the key `shoal models` sends the API)
ENV_NOT_SETTINGS = frozenset({"SHOAL_CONFIG", IDENTITY_ENV, "SHOAL_ADMIN_KEY"})
RUNNER_DEFAULTS = RunnerSettings()  # the runners' defaults, declared once in events/runner_settings.py

_NON_EMPTY = Meta(pattern=r"\S", extra={"allowed": "a non-empty string"})
_NATS_URLS = r"^$|^(nats|tls|tcp)://[^\s/,]+(\s*,\s*(nats|tls|tcp)://[^\s/,]+)*$"
_SEE_NATS_URLS = "empty (run an embedded server) or nats://host:port or tls://host:port, comma-separated for a cluster"
_PEM_FILE = "the path of a PEM file, or empty for none"
_MAX_BYTES = "a byte count of at least 1024, or -1 for unlimited"
LogLevel = Literal["TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"]
LogFormat = Literal["text", "json"]  # json: one object a line, loguru's serializer (`configure_logging`)
# Bearer tokens as RFC 6750 writes them (no ":"), long enough not to be guessed; ":admin" marks an admin key.
_API_KEY = Annotated[str, Meta(pattern=r"^[A-Za-z0-9._~+/=-]{16,512}(:admin)?$")]
_API_KEYS = "keys of 16-512 characters from A-Z a-z 0-9 . _ ~ + / = -, comma-separated, each may end in :admin"
_ORIGIN = Annotated[str, Meta(pattern=r"^https?://[^\s/,*]+$")]
_ORIGINS = "origins such as https://app.example:8443 (scheme://host[:port], no wildcard), comma-separated"
_SECONDS_OR_ZERO = Meta(ge=0, extra={"allowed": "a number of seconds, 0 or more"})
SECRET = Meta(extra={"secret": True})  # never shown: `shoal config show` and /v1/config say only where it came from
_KEY_SHARE = "one key's share of max_queued_tasks, then 429; 0 = all but a quarter kept for other keys (no keys: all)"


DEFAULT_MAX_CHOICES = 8


class ShoalConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Every setting of shoal: its constraint and meaning in its type, then its default."""

    nats_url: Annotated[
        str, Meta(pattern=_NATS_URLS, extra={"allowed": _SEE_NATS_URLS}, description="NATS server(s) to use")
    ] = ""
    nats_tls_ca: Annotated[
        str,
        Meta(
            extra={"allowed": _PEM_FILE},
            description="CA certificate (PEM) that signed the NATS server's certificate; turns TLS on; the "
            "embedded server then also requires client certificates signed by it",
        ),
    ] = ""
    nats_tls_cert: Annotated[
        str,
        Meta(
            extra={"allowed": _PEM_FILE},
            description="this host's certificate (PEM): presented to NATS (mutual TLS) and served by the "
            "embedded server; with nats_tls_key",
        ),
    ] = ""
    nats_tls_key: Annotated[
        str, Meta(extra={"allowed": _PEM_FILE}, description="the private key (PEM) of nats_tls_cert")
    ] = ""
    nats_host: Annotated[str, _NON_EMPTY, Meta(description="address the embedded nats-server binds")] = "127.0.0.1"
    nats_port: Annotated[int, Meta(ge=0, le=65535, description="embedded nats-server port; 0 = any free")] = 4222
    data_dir: Annotated[str, _NON_EMPTY, Meta(description="where the embedded nats-server keeps the log")] = (
        "~/.local/share/shoal"
    )
    nats_sync_interval: SyncInterval = JETSTREAM_SYNC_INTERVAL
    nats_credentials_dir: Annotated[
        str,
        Meta(
            extra={"allowed": "empty, or the path of a directory of nkey seed files"},
            description="this host's NATS identities (nkey seed files from `shoal nats credentials`); "
            "empty = <data_dir>/nats-credentials when a server embedded there made them, else none",
        ),
    ] = ""
    ring_base_port: Annotated[
        int,
        Meta(
            ge=1024,
            le=65000,
            description="lowest TCP port the master gives an instance's ring on a host (the next free one is "
            "taken per instance); two clusters sharing hosts need ranges of their own",
        ),
    ] = DEFAULT_RING_BASE_PORT
    api_host: Annotated[str, _NON_EMPTY, Meta(description="address the OpenAI-compatible API binds")] = "127.0.0.1"
    api_port: Annotated[int, Meta(ge=1, le=65535, description="port of the OpenAI-compatible API")] = 8000
    api_keys: Annotated[
        tuple[_API_KEY, ...],
        SECRET,
        Meta(extra={"allowed": _API_KEYS}, description="bearer tokens the API accepts; KEY:admin for an admin"),
    ] = ()
    api_keys_file: Annotated[
        str,
        Meta(extra={"allowed": "a file path, or empty"}, description="file of API keys, one a line; keep it 0600"),
    ] = ""
    cors_origins: Annotated[
        tuple[_ORIGIN, ...],
        Meta(extra={"allowed": _ORIGINS}, description="browser origins allowed to call the API; none by default"),
    ] = ()
    models: Annotated[
        tuple[Annotated[str, _NON_EMPTY], ...],
        Meta(
            min_length=1,
            extra={"allowed": "model names, comma-separated (env) or a list (shoal.yaml) or --model repeated"},
            description="models served, each `tiny`, an mlx-lm model directory or a Hub id (owner/name): "
            "placed when they fit, in this order",
        ),
    ] = ("tiny",)
    model_keep_alive_seconds: Annotated[
        float,
        Meta(
            extra={"allowed": "a number of seconds; 0 = unload at once; negative = never"},
            description="an instance that served nothing this long is unloaded (a request places it again)",
        ),
    ] = 1800.0
    max_instances_per_model: Annotated[
        int,
        Meta(
            ge=1,
            le=64,
            description="instances of one model at most: a model whose requests wait replica_after_wait_seconds "
            "for a place gets another instance where memory allows (1 = no replicas)",
        ),
    ] = 1
    replica_after_wait_seconds: Annotated[
        float,
        POSITIVE_SECONDS,
        Meta(description="requests waiting this long for a place on a model's ready instances: another instance"),
    ] = 5.0
    min_nodes_per_instance: Annotated[
        int,
        Meta(
            ge=1,
            le=64,
            description="split each instance over at least this many nodes (a pipeline even when one node "
            "would hold the model); placement otherwise takes the fewest nodes that hold it",
        ),
    ] = 1
    link_measure_seconds: Annotated[
        float,
        Meta(
            ge=0,
            extra={"allowed": "a number of seconds, 0 or more"},
            description="how often each worker measures its links to the other nodes (the master orders an "
            "instance's ring along the fastest); 0 = never",
        ),
    ] = 300.0
    node_memory_bytes: Annotated[
        int,
        Meta(
            ge=0,
            extra={"allowed": "a byte count; 0 = the memory available on the host when the worker starts"},
            description="memory this worker offers to placement (leave room for other work; tests)",
        ),
    ] = 0
    model_download: ModelDownload = RUNNER_DEFAULTS.model_download
    workers: Annotated[int, Meta(ge=1, le=64, description="worker nodes `shoal up` starts")] = 2
    masters: Annotated[
        int, Meta(ge=1, le=8, description="masters `shoal up` starts (one leads, the rest stand by)")
    ] = 1
    prefill_step_size: PrefillStepSize = RUNNER_DEFAULTS.prefill_step_size
    kv_bits: KvBits = RUNNER_DEFAULTS.kv_bits
    kv_group_size: KvGroupSize = RUNNER_DEFAULTS.kv_group_size
    max_tokens_limit: Annotated[int, Meta(ge=1, description="the most tokens a request may ask for")] = 4096
    max_prompt_tokens: Annotated[int, Meta(ge=1, description="the most tokens a prompt may have")] = 32768
    max_body_bytes: Annotated[int, Meta(ge=1024, description="the largest request body the API reads")] = 1_000_000
    sse_keepalive_seconds: Annotated[
        float,
        _SECONDS_OR_ZERO,
        Meta(
            description="silence on a stream (queued, in prefill, a held-up decode) that sends an SSE comment; 0 = never"
        ),
    ] = 10.0
    max_queued_tasks: Annotated[
        int, Meta(ge=1, description="tasks of one model waiting or running at once; beyond it the API answers 429")
    ] = 64
    max_queued_tasks_per_key: Annotated[int, Meta(ge=0, description=_KEY_SHARE)] = 0
    max_choices: Annotated[
        int,
        Meta(
            ge=1,
            le=128,  # OpenAI's own bound on `n`
            description=(
                "the most completions (`n`) one chat or text completion request may ask for; each is a row of "
                "the batch and counts as a task in the queue limits, so at most max_batch and max_queued_tasks "
                "(left unset: 8, or the less of those)"
            ),
        ),
    ] = DEFAULT_MAX_CHOICES
    request_timeout_seconds: Annotated[
        float,
        _SECONDS_OR_ZERO,
        Meta(description="a task not ended this long after its request fails (504 if not streamed); 0 = never"),
    ] = 600.0
    task_stall_seconds: Annotated[float, POSITIVE_SECONDS, Meta(description="no progress this long fails a task")] = (
        30.0
    )
    node_timeout_seconds: Annotated[float, POSITIVE_SECONDS, Meta(description="silence that times a node out")] = 10.0
    master_lease_seconds: Annotated[
        float, POSITIVE_SECONDS, Meta(description="a leading master unheard this long is replaced by a stand-by")
    ] = DEFAULT_LEASE_SECONDS
    instance_ready_timeout_seconds: Annotated[
        float,
        POSITIVE_SECONDS,
        Meta(
            description=(
                "an instance with no loading progress (placement, a rank's status, a download's progress) "
                "this long is retired and the tasks waiting for its model fail"
            )
        ),
    ] = 900.0
    heartbeat_interval_seconds: HeartbeatIntervalSeconds = RUNNER_DEFAULTS.heartbeat_interval_seconds
    stall_stack_seconds: StallStackSeconds = RUNNER_DEFAULTS.stall_stack_seconds
    publish_backlog_events: PublishBacklogEvents = RUNNER_DEFAULTS.publish_backlog_events
    max_batch: MaxBatch = RUNNER_DEFAULTS.max_batch
    batch_chunk_events_per_round: BatchChunkEventsPerRound = RUNNER_DEFAULTS.batch_chunk_events_per_round
    stream_chunk_min_interval_seconds: StreamChunkMinIntervalSeconds = RUNNER_DEFAULTS.stream_chunk_min_interval_seconds
    prefix_cache_bytes: PrefixCacheBytes = RUNNER_DEFAULTS.prefix_cache_bytes
    kv_cache_bytes: KvCacheBytes = RUNNER_DEFAULTS.kv_cache_bytes
    events_max_age_seconds: Annotated[float, POSITIVE_SECONDS, Meta(description="how long events are kept")] = (
        7 * 86400.0
    )
    events_max_bytes: Annotated[  # 0..1023 are refused in `_refuse_nonsense`: no Meta bound says "or -1"
        int, Meta(ge=-1, extra={"allowed": _MAX_BYTES}, description="size limit of the event log; -1 = none")
    ] = 1 << 30
    telemetry_max_age_seconds: Annotated[float, POSITIVE_SECONDS, Meta(description="how long heartbeats are kept")] = (
        3600.0
    )
    stream_replicas: Annotated[int, Meta(ge=1, le=5, description="copies of each stream in a NATS cluster")] = 1
    finished_tasks_kept: Annotated[
        int, Meta(ge=0, description="ended tasks each service holds whole in memory (older: from the log); 0 = all")
    ] = FINISHED_TASKS_KEPT
    snapshot_every_events: Annotated[
        int, Meta(ge=0, description="events between the master's snapshots of the State (start-ups); 0 = none")
    ] = 10_000
    runner_log_bytes: Annotated[
        int,
        Meta(
            ge=RUNNER_LOG_BYTES_LEAST,
            description="the most bytes of each runner's stderr a worker keeps, in "
            "<data_dir>/runner-logs/<node_id>/<instance>.rank<r>.log and its rotated .1 together",
        ),
    ] = RUNNER_LOG_BYTES
    blas: BlasSetting = "auto"
    pin_runner_threads: PinRunnerThreads = True
    log_level: Annotated[LogLevel, Meta(description="the least severe log message printed")] = "INFO"
    log_format: Annotated[
        LogFormat, Meta(description="log lines as text, or as one JSON object each (loguru's serializer)")
    ] = "text"

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def client_nats_url(self) -> str:
        """Where clients connect: `nats_url`, else the embedded server at nats_host:nats_port."""
        if self.nats_url:
            return self.nats_url
        host = "127.0.0.1" if self.nats_host in ("0.0.0.0", "::") else self.nats_host
        scheme = "tls" if self.nats_tls.has_identity else "nats"  # as `EmbeddedNats.url`
        return f"{scheme}://{host}:{self.nats_port}"

    @property
    def nats_tls(self) -> TlsFiles:
        return TlsFiles(ca=self.nats_tls_ca, cert=self.nats_tls_cert, key=self.nats_tls_key)

    @property
    def nats_endpoint(self) -> NatsEndpoint:
        """Where this host's NATS is and its TLS files; each role adds its identity (`credentials.endpoint_for`)."""
        return NatsEndpoint(url=self.client_nats_url, tls=self.nats_tls)


KEYS: tuple[str, ...] = ShoalConfig.__struct_fields__
DEFAULTS = ShoalConfig()


class ResolvedConfig(msgspec.Struct, frozen=True, kw_only=True):
    config: ShoalConfig
    sources: dict[str, str]
    yaml_path: str | None = None

    def items(self) -> list[tuple[str, object, str]]:
        """(key, value, source) per setting, in order, secrets redacted: what `shoal config show` shows."""
        return [(key, _shown(key, getattr(self.config, key)), self.sources[key]) for key in KEYS]

    def to_dict(self) -> dict[str, dict[str, object]]:
        """{key: {"value": v, "source": s}}: what `GET /v1/config` returns (secrets redacted)."""
        return {key: {"value": value, "source": source} for key, value, source in self.items()}


def _shown(key: str, value: object) -> object:
    """`value` as it may be shown: a secret says only how many values it holds."""
    if not FIELDS.is_secret(key) or not value:
        return value
    if isinstance(value, tuple):
        return f"<redacted: {len(cast('tuple[object, ...]', value))} values>"
    return REDACTED


def runner_settings(config: ShoalConfig) -> RunnerSettings:
    """What every rank of an instance placed with this config runs with (same names, same values)."""
    return msgspec.convert(config, RunnerSettings, from_attributes=True)


# --- checks ---------------------------------------------------------------------------------

FIELDS = DeclaredFields(ShoalConfig)


def is_secret_variable(name: str) -> bool:
    """Whether environment variable `name` holds a secret setting (SHOAL_API_KEYS): such a
    variable is never handed down to a child process that has no use for it."""
    key = name.removeprefix(ENV_PREFIX).lower()
    return name.startswith(ENV_PREFIX) and key in KEYS and FIELDS.is_secret(key)


def _refuse_nonsense(config: ShoalConfig, sources: Mapping[str, str]) -> None:
    """Values each fine alone, refused together (or, once, beyond what a Meta bound can say)."""
    if 0 <= config.events_max_bytes < 1024:
        key = "events_max_bytes"
        raise ConfigError(key, config.events_max_bytes, sources[key], FIELDS.allowed(key))
    for key, pair in (("nats_tls_cert", "nats_tls_key"), ("nats_tls_key", "nats_tls_cert")):
        if getattr(config, key) and not getattr(config, pair):
            raise ConfigError(
                key, getattr(config, key), sources[key], f"set together with {pair} (a certificate and its key)"
            )
    for limit in ("max_batch", "max_queued_tasks"):  # a request of max_choices must fit both
        _at_most(config, sources, "max_choices", limit, "a request asking for that many completions could never run")
    why = "a node would time out between two of its heartbeats"
    _below(config, sources, "heartbeat_interval_seconds", "node_timeout_seconds", why)
    why = "a stuck task would be failed before a heartbeat carries the stuck rank's stack"
    _below(config, sources, "stall_stack_seconds", "task_stall_seconds", why)
    why = "a decoding task would look stalled between two heartbeats (they carry its progress to the master)"
    _below(config, sources, "heartbeat_interval_seconds", "task_stall_seconds", why)


def _below(config: ShoalConfig, sources: Mapping[str, str], key: str, limit: str, why: str) -> None:
    """Refuse `key >= limit`, blaming the one of the two that was set (`key` when both or neither were)."""
    value, bound = getattr(config, key), getattr(config, limit)
    if value < bound:
        return
    if sources[key] == "default" and sources[limit] != "default":
        raise ConfigError(limit, bound, sources[limit], f"more than {key}={value!r} (from {sources[key]}): {why}")
    raise ConfigError(key, value, sources[key], f"less than {limit}={bound!r} (from {sources[limit]}): {why}")


def _fitted_defaults(config: ShoalConfig, sources: Mapping[str, str]) -> ShoalConfig:
    """Defaults that follow what was set: `max_choices` left unset is at most `max_batch` and
    `max_queued_tasks` (a batch of 4 takes requests of up to 4 completions); set, it is checked."""
    if sources["max_choices"] != "default":
        return config
    fitted = min(DEFAULT_MAX_CHOICES, config.max_batch, config.max_queued_tasks)
    return msgspec.structs.replace(config, max_choices=fitted)


def _at_most(config: ShoalConfig, sources: Mapping[str, str], key: str, limit: str, why: str) -> None:
    """Refuse `key > limit`, blaming `key` (a default that would pass `limit` follows it: `_fitted_defaults`)."""
    value, bound = getattr(config, key), getattr(config, limit)
    if value > bound:
        raise ConfigError(key, value, sources[key], f"more than {limit}={bound!r} (from {sources[limit]}): {why}")


def _closest(name: str) -> str | None:
    matches = difflib.get_close_matches(name.lower(), KEYS, n=1, cutoff=0.75)
    return matches[0] if matches else None


# Settings that no longer exist, and what replaced them: named, never "not a shoal setting".
RETIRED_SETTINGS: dict[str, str] = {
    "decode_cancel_poll_tokens": "retired: every task runs in the batch, whose every step polls the cancel "
    "source (one engine path); remove the setting",
}


def _unknown_key_error(key: str, value: object, source: str) -> ConfigError:
    if key.lower() in RETIRED_SETTINGS:
        return ConfigError(key, value, source, RETIRED_SETTINGS[key.lower()])
    near = _closest(key)
    hint = f"did you mean {near}?" if near else f"known settings: {', '.join(KEYS)}"
    shown = REDACTED if near is not None and FIELDS.is_secret(near) else value  # SHOAL_API_KEY=<a key>
    return ConfigError(key, shown, source, f"not a shoal setting; {hint}")


# --- resolution ------------------------------------------------------------------------------


def resolve_config(
    cli_overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    yaml_path: str | os.PathLike[str] | None = None,
) -> ResolvedConfig:
    """Merge defaults < YAML < SHOAL_* env < CLI overrides (key -> value; None = not given)."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    sources = dict.fromkeys(KEYS, "default")
    path = find_yaml(str(yaml_path) if yaml_path else None, env)
    if path is not None:
        for key, value in read_yaml(path).items():
            if key not in KEYS:
                raise _unknown_key_error(key, value, f"{path.name} ({path})")
            values[key], sources[key] = FIELDS.checked(key, value, path.name), "shoal.yaml"
    for name, text in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_SETTINGS:
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key in KEYS:
            values[key], sources[key] = FIELDS.checked(key, text, f"env {name}"), f"env {name}"
        elif key in RETIRED_SETTINGS or _closest(key) is not None:
            raise _unknown_key_error(key, text, f"env {name}")
    for key, value in (cli_overrides or {}).items():
        if value is None:
            continue
        flag = f"cli --{key.replace('_', '-')}"
        if key not in KEYS:
            raise _unknown_key_error(key, value, flag)
        values[key], sources[key] = FIELDS.checked(key, value, flag), flag
    config = _fitted_defaults(msgspec.structs.replace(DEFAULTS, **values), sources)
    _refuse_nonsense(config, sources)
    return ResolvedConfig(config=config, sources=sources, yaml_path=str(path) if path else None)


# --- CLI helpers -----------------------------------------------------------------------------


def add_common_flags(parser: argparse.ArgumentParser) -> None:
    """`--config FILE` and `--nats-url URL`, shared by every command that needs the config."""
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (default: ./shoal.yaml)")
    parser.add_argument("--nats-url", default=None, help="NATS server URL (default: an embedded server)")


def add_setting_flag(parser: argparse.ArgumentParser, key: str, help_text: str) -> None:
    """A `--key-name` flag whose value overrides setting `key` (parsed like the env var)."""
    parser.add_argument(f"--{key.replace('_', '-')}", dest=key, default=None, help=help_text)


def add_models_flag(parser: argparse.ArgumentParser, help_text: str) -> None:
    """`--model M`, repeatable: the setting `models` (one value per flag)."""
    parser.add_argument("--model", dest="models", action="append", default=None, metavar="MODEL", help=help_text)


def config_from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> ResolvedConfig:
    """The resolved config for a parsed command line: every attribute named like a setting counts."""
    overrides = {key: getattr(args, key) for key in KEYS if getattr(args, key, None) is not None}
    return resolve_config(overrides, env=env, yaml_path=getattr(args, "config", None))


def log_settings(config: ShoalConfig) -> LogSettings:
    """The event log's stream settings from the config."""
    return LogSettings(
        events=StreamLimits(max_age_seconds=config.events_max_age_seconds, max_bytes=config.events_max_bytes),
        telemetry=StreamLimits(max_age_seconds=config.telemetry_max_age_seconds, max_bytes=256 << 20),
        replicas=config.stream_replicas,
    )
