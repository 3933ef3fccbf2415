"""Bounded fuzzing of the files and variables an operator hands shoal (issue 10): the config
loader (YAML and SHOAL_* env) and the export readers answer a typed error or a value, never
another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import msgspec
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog.export import BadExportLine, read_export
from events import codec
from services.config import KEYS, ConfigError, resolve_config
from services.ops.load import ExportReader
from services.ops.scan import scan
from tests.events.strategies import event_strategy

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), st.sampled_from(["-1", "1e999", "nan"])
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
)
_keys = st.one_of(st.sampled_from(sorted(KEYS)), st.text(max_size=12))


def _write(content: bytes) -> Path:
    handle = tempfile.NamedTemporaryFile(suffix=".yaml", delete=False)  # noqa: SIM115 - hypothesis reuses no fixture
    with handle:
        handle.write(content)
    return Path(handle.name)


def _resolves_or_is_refused(**kwargs: Any) -> None:
    try:
        resolve_config(**kwargs)
    except ConfigError:
        pass


@FUZZ
@given(
    st.one_of(st.binary(max_size=300), st.dictionaries(_keys, _values, max_size=4).map(yaml.safe_dump).map(str.encode))
)
def test_any_yaml_file_is_a_config_or_a_config_error(content: bytes) -> None:
    path = _write(content)
    try:
        _resolves_or_is_refused(env={}, yaml_path=path)
    finally:
        path.unlink()


@FUZZ
@given(st.dictionaries(_keys.map(lambda key: f"SHOAL_{key.upper()}"), st.text(max_size=20), max_size=4))
def test_any_shoal_environment_is_a_config_or_a_config_error(env: dict[str, str]) -> None:
    _resolves_or_is_refused(env={name: text.replace("\0", "") for name, text in env.items()})


def _record_line(event: Any, seq: int) -> bytes:
    stream = "telemetry" if type(event).__name__.endswith("Heartbeat") else "events"
    return codec.encode_record(codec.ExportRecord(stream=stream, seq=seq, event=event))


_lines = st.lists(
    st.one_of(
        st.tuples(event_strategy(), st.integers(min_value=-2, max_value=6)).map(lambda pair: _record_line(*pair)),
        st.binary(max_size=80).map(lambda raw: raw.replace(b"\n", b"")),
        st.dictionaries(st.sampled_from(["stream", "seq", "event"]), _values, max_size=3).map(msgspec.json.encode),
    ),
    max_size=8,
)


@FUZZ
@given(_lines)
def test_any_export_file_reads_or_names_its_bad_line(lines: list[bytes]) -> None:
    path = _write(b"\n".join(lines))
    try:
        try:
            read_export(path)
        except BadExportLine as exc:
            assert 1 <= exc.line <= len(lines)
        reader = ExportReader(path)  # what diagnose and replay read: up to the first unusable line
        scan(reader, abandon=reader.abandon)
    finally:
        path.unlink()
