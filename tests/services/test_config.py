"""Config resolution: defaults < shoal.yaml < SHOAL_* env < CLI, every value with its source."""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import pytest

from events.runner_settings import RunnerSettings
from services.cli import main
from services.config import (
    FIELDS,
    KEYS,
    ConfigError,
    ShoalConfig,
    add_common_flags,
    add_setting_flag,
    config_from_args,
    log_settings,
    resolve_config,
    runner_settings,
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
        ({"SHOAL_TASK_STALL_SECONDS": "inf"}, "task_stall_seconds", "at most 1e+09"),
        ({"SHOAL_PREFILL_STEP_SIZE": "0"}, "prefill_step_size", "an integer from 1 up"),
        ({"SHOAL_KV_GROUP_SIZE": "48"}, "kv_group_size", "one of 32, 64 or 128"),
        ({"SHOAL_BLAS": " "}, "blas", "the path of a BLAS library"),
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


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shoal.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("layer", "source"),
    [("yaml", "shoal.yaml"), ("env", "env SHOAL_WORKERS"), ("flag", "cli --workers")],
)
def test_a_bad_value_from_any_layer_names_key_value_source_and_what_is_allowed(
    tmp_path: Path, layer: str, source: str
) -> None:
    yaml_path = _write(tmp_path, "workers: 99\n" if layer == "yaml" else "")
    env = {"SHOAL_WORKERS": "99"} if layer == "env" else {}
    flags = {"workers": 99} if layer == "flag" else {}
    with pytest.raises(ConfigError) as caught:
        resolve_config(flags, env=env, yaml_path=yaml_path)
    assert (caught.value.key, caught.value.source) == ("workers", source)
    shown = "'99'" if layer == "env" else "99"  # env text is shown as the text it was
    assert str(caught.value) == f"invalid setting workers={shown} (from {source}): an integer from 1 to 64"


def test_unrelated_shoal_variables_are_not_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./shoal.yaml here
    resolved = resolve_config({}, env={"SHOAL_RUNNER_JOB_DIRECTORY_PATH": "/x", "SHOAL_CONFIG": ""})
    assert resolved.config == ShoalConfig() and set(resolved.sources.values()) == {"default"}
    with pytest.raises(ConfigError, match="did you mean workers"):  # a near miss is a typo, not another tool's
        resolve_config({}, env={"SHOAL_WORKRES": "3"})


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


def test_text_is_read_strictly_as_the_declared_type() -> None:
    assert FIELDS.checked("api_port", " 42 ", "t") == 42
    assert FIELDS.checked("kv_bits", "None", "t") is None and FIELDS.checked("kv_bits", "8", "t") == 8
    assert FIELDS.checked("task_stall_seconds", "1e1", "t") == 10.0
    assert FIELDS.checked("log_level", "debug", "t") == "DEBUG"
    assert FIELDS.checked("data_dir", " 8 ", "t") == " 8 "  # a string setting takes the text as it is
    for bad in ("4_2", "0x10", "", "1.5", "2.0", "true", "null"):
        with pytest.raises(ConfigError, match="an integer from 1 to 65535"):
            FIELDS.checked("api_port", bad, "t")
    with pytest.raises(ConfigError):
        FIELDS.checked("workers", True, "t")  # YAML's `true` is no count


def test_every_setting_says_what_it_allows() -> None:
    for key in KEYS:
        assert FIELDS.allowed(key) and "regex" not in FIELDS.allowed(key)


@pytest.mark.parametrize(
    ("env", "blamed", "fragment"),
    [
        (
            {"SHOAL_HEARTBEAT_INTERVAL_SECONDS": "10"},
            "heartbeat_interval_seconds",
            "less than node_timeout_seconds=10.0 (from default)",
        ),
        (
            {"SHOAL_NODE_TIMEOUT_SECONDS": "0.5"},
            "node_timeout_seconds",
            "more than heartbeat_interval_seconds=1.0 (from default)",
        ),
        ({"SHOAL_STALL_STACK_SECONDS": "45"}, "stall_stack_seconds", "less than task_stall_seconds=30.0"),
        ({"SHOAL_TASK_STALL_SECONDS": "5"}, "task_stall_seconds", "more than stall_stack_seconds=5.0"),
        (
            {
                "SHOAL_HEARTBEAT_INTERVAL_SECONDS": "8",
                "SHOAL_NODE_TIMEOUT_SECONDS": "20",
                "SHOAL_STALL_STACK_SECONDS": "2",
                "SHOAL_TASK_STALL_SECONDS": "6",
            },
            "heartbeat_interval_seconds",
            "less than task_stall_seconds=6.0",
        ),
        ({"SHOAL_EVENTS_MAX_BYTES": "0"}, "events_max_bytes", "-1 for unlimited"),
    ],
)
def test_values_that_make_no_sense_together_are_refused(env: dict[str, str], blamed: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_config({}, env=env)
    assert caught.value.key == blamed and caught.value.source == f"env {next(iter(env))}"
    assert fragment in str(caught.value)


def test_the_same_pair_is_fine_the_right_way_round() -> None:
    env = {"SHOAL_HEARTBEAT_INTERVAL_SECONDS": "0.5", "SHOAL_NODE_TIMEOUT_SECONDS": "2", "SHOAL_EVENTS_MAX_BYTES": "-1"}
    config = resolve_config({}, env=env).config
    assert (config.heartbeat_interval_seconds, config.node_timeout_seconds, config.events_max_bytes) == (0.5, 2.0, -1)


def _fields(struct: type[msgspec.Struct]) -> dict[str, msgspec.inspect.Field]:
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    return {field.name: field for field in info.fields}


def test_runner_settings_are_config_keys_with_the_same_type_and_default() -> None:
    config_fields = _fields(ShoalConfig)
    for name, field in _fields(RunnerSettings).items():
        assert (config_fields[name].type, config_fields[name].default) == (field.type, field.default)
    assert runner_settings(ShoalConfig()) == RunnerSettings()


def test_runner_settings_carry_the_configs_values(yaml_file: Path) -> None:
    env = {"SHOAL_PREFILL_STEP_SIZE": "64", "SHOAL_STALL_STACK_SECONDS": "3"}
    settings = runner_settings(resolve_config({"heartbeat_interval_seconds": 0.5}, env=env, yaml_path=yaml_file).config)
    assert settings == RunnerSettings(
        prefill_step_size=64,
        kv_bits=4,  # from the file
        heartbeat_interval_seconds=0.5,
        stall_stack_seconds=3.0,
    )


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


@pytest.mark.parametrize("command", ["up", "nats"])
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_data_dir_that_cannot_be_written_is_a_setting_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str, where: str
) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    data_dir = taken if where == "a file" else taken / "data"
    monkeypatch.setenv("SHOAL_DATA_DIR", str(data_dir))
    assert main([command]) != 0  # before: NotADirectoryError from deep in the tiny model's cache
    err = capsys.readouterr().err
    assert f"shoal {command}: invalid setting data_dir='{data_dir}' (from env SHOAL_DATA_DIR)" in err
    assert "a directory this user can create and write in" in err and "--data-dir" in err
    assert not (tmp_path / "nats").exists()


def test_max_choices_over_the_batch_or_the_queue_is_refused_naming_the_one_set(tmp_path: Path) -> None:
    yaml_path = _write(tmp_path, "")
    with pytest.raises(ConfigError, match=r"max_choices=16 \(from env SHOAL_MAX_CHOICES\): more than max_batch=8"):
        resolve_config({"max_batch": 8}, env={"SHOAL_MAX_CHOICES": "16"}, yaml_path=yaml_path)
    with pytest.raises(ConfigError, match=r"max_choices=5 \(from cli --max-choices\): more than max_queued_tasks=2"):
        resolve_config({"max_queued_tasks": 2, "max_choices": 5}, env={}, yaml_path=yaml_path)
    assert resolve_config({"max_batch": 4, "max_choices": 4}, env={}, yaml_path=yaml_path).config.max_choices == 4
    # left unset, it follows the batch and the queue (a batch of one takes one completion a request)
    assert resolve_config({"max_batch": 1}, env={}, yaml_path=yaml_path).config.max_choices == 1
    assert resolve_config({"max_queued_tasks": 3}, env={}, yaml_path=yaml_path).config.max_choices == 3
    assert resolve_config({}, env={}, yaml_path=yaml_path).config.max_choices == 8


def test_a_retired_setting_says_what_replaced_it() -> None:
    with pytest.raises(ConfigError, match="retired: every task runs in the batch"):
        resolve_config(env={"SHOAL_DECODE_CANCEL_POLL_TOKENS": "4"})
