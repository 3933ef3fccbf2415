from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from services.ops.load import ExportReader, load_export
from services.ops.offline import diagnose_file, scan_file
from tests.ops import scenarios

ExportFile = Callable[..., Path]


def test_a_clean_file_loads_every_record(export_file: ExportFile) -> None:
    log = scenarios.healthy()
    loaded = load_export(export_file(log))
    assert loaded.skipped is None
    assert loaded.records == log.records


def test_a_truncated_last_line_is_reported_and_everything_before_is_used(export_file: ExportFile) -> None:
    log = scenarios.compute_stall()
    path = export_file(log, tail=b'{"stream":"events","seq":999,"event":{"type":"task_')
    loaded = load_export(path)
    assert len(loaded.records) == len(log.records)
    assert loaded.skipped is not None
    assert loaded.skipped.line == len(log.records) + 1
    assert loaded.skipped.reason.startswith("truncated line")
    assert loaded.skipped.lines_not_used == 1
    assert [f.cause for f in diagnose_file(path).findings] == ["stalled_in_compute"]  # the diagnosis survives


def test_a_corrupt_middle_line_stops_there_and_counts_what_was_left(tmp_path: Path, export_file: ExportFile) -> None:
    log = scenarios.healthy()
    good = export_file(log).read_bytes().splitlines(keepends=True)
    good[10] = b'{"stream":"events","seq":11,"event":{"type":"no_such_event"}}\n'
    path = tmp_path / "corrupt.jsonl"
    path.write_bytes(b"".join(good))
    reader = ExportReader(path)
    assert len(list(reader)) == 10
    assert reader.skipped is not None
    assert (reader.skipped.line, reader.skipped.lines_not_used) == (11, len(good) - 10)
    assert reader.skipped.reason.startswith("malformed record")
    assert "line 11" in reader.skipped.describe()


def test_blank_lines_are_not_damage(tmp_path: Path, export_file: ExportFile) -> None:
    path = export_file(scenarios.healthy())
    lines = path.read_bytes().splitlines(keepends=True)
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_bytes(b"\n".join(lines) + b"\n\n")
    loaded = load_export(spaced)
    assert loaded.skipped is None and len(loaded.records) == len(lines)


def test_a_sequence_gap_is_reported_like_a_bad_line(tmp_path: Path, export_file: ExportFile) -> None:
    path = export_file(scenarios.healthy())
    lines = path.read_bytes().splitlines(keepends=True)
    events_only = [line for line in lines if b'"stream":"events"' in line]
    gapped = tmp_path / "gap.jsonl"
    gapped.write_bytes(b"".join(events_only[:12] + events_only[13:]))
    result, skipped = scan_file(gapped)
    assert skipped is not None and skipped.line == 13
    assert "sequence gap" in skipped.reason
    assert skipped.lines_not_used == len(events_only) - 13
    assert result.state.last_seq == 12


def test_a_log_whose_head_was_trimmed_folds_from_its_first_seq(tmp_path: Path) -> None:
    log = scenarios.LogBuilder()
    log.node_joined("n0")  # seq 1, "trimmed by retention" below
    log.node_joined("n1")
    log.node_joined("n2")
    from events.codec import encode_record

    path = tmp_path / "trimmed.jsonl"
    path.write_bytes(b"".join(encode_record(r) + b"\n" for r in log.records[1:]))
    result, skipped = scan_file(path)
    assert skipped is None
    assert result.state.last_seq == 3 and set(result.state.nodes) == {"n1", "n2"}
