"""Config resolution: defaults < shoal.yaml < SHOAL_* env < CLI, every value with its source."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.cli import main
from services.config import (
    KEYS,
    ConfigError,
    ShoalConfig,
    add_common_flags,
    add_setting_flag,
    config_from_args,
    log_settings,
    parse_text,
    resolve_config,
)


@pytest.fixture
def yaml_file(tmp_path: Path) -> Path:
    path = tmp_path / "shoal.yaml"
    path.write_text("api_port: 9000\nkv_bits: 4\nworkers: 3\nlog_level: debug\ntask_stall_seconds: 12\n")
    return path


def test_defaults_when_nothing_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./shoal.yaml here
    resolved = resolve_config({}, env={})
    assert resolved.config == ShoalConfig()
    assert set(resolved.sources.values()) == {"default"}
    assert [key for key, _, _ in resolved.items()] == list(KEYS)
    assert resolved.config.client_nats_url == "nats://127.0.0.1:4222"


def test_each_layer_overrides_the_one_below_and_remembers_its_source(yaml_file: Path) -> None:
    env = {"SHOAL_API_PORT": "9100", "SHOAL_KV_BITS": "none", "SHOAL_DATA_DIR": "/data/shoal"}
    resolved = resolve_config({"api_port": 9200, "nats_url": None}, env=env, yaml_path=yaml_file)
    config, sources = resolved.config, resolved.sources
    assert (config.api_port, sources["api_port"]) == (9200, "cli --api-port")
    assert (config.kv_bits, sources["kv_bits"]) == (None, "env SHOAL_KV_BITS")  # env beats the file
    assert (config.workers, sources["workers"]) == (3, "shoal.yaml")
    assert (config.log_level, config.task_stall_seconds) == ("DEBUG", 12.0)
    assert (config.data_dir, sources["data_dir"]) == ("/data/shoal", "env SHOAL_DATA_DIR")
    assert (config.nats_url, sources["nats_url"]) == ("", "default")  # None = flag not given
    assert resolved.to_dict()["api_port"] == {"value": 9200, "source": "cli --api-port"}


def test_env_beats_the_yaml_file_even_when_the_file_sets_the_key(yaml_file: Path) -> None:
    resolved = resolve_config({}, env={"SHOAL_CONFIG": str(yaml_file), "SHOAL_KV_BITS": "8"})
    assert resolved.config.kv_bits == 8 and resolved.sources["kv_bits"] == "env SHOAL_KV_BITS"
    assert resolved.yaml_path == str(yaml_file)


@pytest.mark.parametrize(
    ("env", "key", "fragment"),
    [
        ({"SHOAL_API_PORT": "80x"}, "api_port", "an integer"),
        ({"SHOAL_API_PORT": "70000"}, "api_port", "from 1 to 65535"),
        ({"SHOAL_WORKERS": "2.0"}, "workers", "an integer"),
        ({"SHOAL_KV_BITS": "5"}, "kv_bits", "2, 3, 4, 6 or 8"),
        ({"SHOAL_TASK_STALL_SECONDS": "nan"}, "task_stall_seconds", "a number"),
        ({"SHOAL_TASK_STALL_SECONDS": "0"}, "task_stall_seconds", "greater than 0"),
        ({"SHOAL_LOG_LEVEL": "loud"}, "log_level", "one of TRACE"),
        ({"SHOAL_NATS_URL": "http://x"}, "nats_url", "nats://host:port"),
        ({"SHOAL_EVENTS_MAX_BYTES": "10"}, "events_max_bytes", "-1 for unlimited"),
        ({"SHOAL_NATS_PORRT": "1"}, "nats_porrt", "did you mean nats_port?"),
    ],
)
def test_invalid_env_values_name_key_value_source_and_what_is_allowed(
    env: dict[str, str], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config({}, env=env, yaml_path=None)
    error = caught.value
    name = next(iter(env))
    assert error.key == key and error.source == f"env {name}"
    assert key in str(error) and name in str(error) and fragment in str(error)
    assert repr(error.value).strip("'") in str(error)


def test_unrelated_shoal_variables_are_not_settings() -> None:
    resolve_config({}, env={"SHOAL_RUNNER_JOB_DIRECTORY_PATH": "/x", "SHOAL_CONFIG": ""})


def test_yaml_errors_name_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "shoal.yaml"
    path.write_text("api_prot: 9000\n")
    with pytest.raises(ConfigError, match=r"api_prot.*shoal.yaml.*did you mean api_port"):
        resolve_config({}, env={}, yaml_path=path)
    path.write_text("workers: true\n")
    with pytest.raises(ConfigError, match=r"workers=True \(from shoal.yaml\)"):
        resolve_config({}, env={}, yaml_path=path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        resolve_config({}, env={}, yaml_path=path)
    with pytest.raises(ConfigError, match="an existing YAML file"):
        resolve_config({}, env={}, yaml_path=tmp_path / "missing.yaml")


def test_cli_values_are_checked_like_the_rest() -> None:
    with pytest.raises(ConfigError, match=r"api_port='x' \(from cli --api-port\)"):
        resolve_config({"api_port": "x"}, env={})
    with pytest.raises(ConfigError, match="not a shoal setting"):
        resolve_config({"no_such": 1}, env={})


def test_strict_text_parsing() -> None:
    assert parse_text("api_port", " 42 ", "t") == 42
    assert parse_text("kv_bits", "None", "t") is None
    assert parse_text("task_stall_seconds", "1e1", "t") == 10.0
    for bad in ("4_2", "0x10", "", "1.5"):
        with pytest.raises(ConfigError):
            parse_text("api_port", bad, "t")


def test_common_flags_feed_the_resolution(yaml_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser()
    add_common_flags(parser)
    add_setting_flag(parser, "api_port", "port")
    args = parser.parse_args(["--config", str(yaml_file), "--nats-url", "nats://h:1", "--api-port", "9300"])
    resolved = config_from_args(args, env={})
    assert resolved.config.nats_url == "nats://h:1" and resolved.sources["nats_url"] == "cli --nats-url"
    assert resolved.config.api_port == 9300 and resolved.config.workers == 3


def test_log_settings_follow_the_config() -> None:
    settings = log_settings(ShoalConfig(events_max_age_seconds=60.0, stream_replicas=3, events_max_bytes=-1))
    assert settings.events.max_age_seconds == 60.0 and settings.events.max_bytes == -1 and settings.replicas == 3


def test_config_show_prints_values_and_sources(
    yaml_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHOAL_API_PORT", "9100")
    assert main(["config", "show", "--config", str(yaml_file), "--nats-url", "nats://h:4"]) == 0
    out = capsys.readouterr().out
    assert any(line.split() == ["api_port", "9100", "env", "SHOAL_API_PORT"] for line in out.splitlines())
    assert any(line.split() == ["workers", "3", "shoal.yaml"] for line in out.splitlines())
    assert any(line.split() == ["nats_url", "nats://h:4", "cli", "--nats-url"] for line in out.splitlines())
    monkeypatch.setenv("SHOAL_API_PORT", "nope")
    assert main(["config", "show"]) == 2
    assert "api_port='nope' (from env SHOAL_API_PORT)" in capsys.readouterr().err
