"""export -> import -> export through the CLI, and all-or-nothing imports of bad files."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from eventlog.export import BadExportLine, fold_export, read_export
from eventlog.log import EventLog
from events.catalogue import Origin, RunnerHeartbeat
from events.ids import InstanceId
from events.stamp import Stamper
from events.synthetic import synthetic_history
from services.cli import main
from services.nats import EmbeddedNats


async def _seed(url: str, count: int, beats: int = 0) -> None:
    log = await EventLog.connect(url)
    try:
        await log.delete_streams()
        await log.ensure_streams()
        await log.append_many(synthetic_history(count))
        stamper = Stamper(Origin(service="runner", node="n1", rank=0))
        beat_events = [
            RunnerHeartbeat(
                env=stamper.stamp(f"hb-{i}"), instance_id=InstanceId("inst-synthetic"), rank=0, phase="idle"
            )
            for i in range(beats)
        ]
        await log.append_many(beat_events)
    finally:
        await log.close()


async def _count(url: str) -> int:
    log = await EventLog.connect(url)
    try:
        return await log.message_count()
    finally:
        await log.close()


def test_export_import_export_gives_identical_files(
    nats_url: str, make_nats: Callable[..., EmbeddedNats], tmp_path: Path
) -> None:
    asyncio.run(_seed(nats_url, 2000, beats=5))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert main(["events", "export", "--nats-url", nats_url, "--telemetry", "-o", str(first)]) == 0
    lines = first.read_bytes().splitlines()
    assert len(lines) == 2005
    assert json.loads(lines[0])["seq"] == 1 and json.loads(lines[0])["event"]["type"] == "node_joined"

    fresh = make_nats("fresh").start()
    assert main(["events", "import", "--nats-url", fresh.url, str(first)]) == 0
    assert main(["events", "export", "--nats-url", fresh.url, "--telemetry", "-o", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    # importing again is refused: the streams are no longer empty
    assert main(["events", "import", "--nats-url", fresh.url, str(first)]) == 2
    assert asyncio.run(_count(fresh.url)) == 2000


def test_export_of_one_task_and_since_a_seq(nats_url: str, tmp_path: Path) -> None:
    asyncio.run(_seed(nats_url, 500))
    out = tmp_path / "task.jsonl"
    assert main(["events", "export", "--nats-url", nats_url, "--task", "task-00000003", "-o", str(out)]) == 0
    records = read_export(out)
    assert records and {getattr(r.event, "task_id", None) for r in records} == {"task-00000003"}
    assert main(["events", "export", "--nats-url", nats_url, "--since", "450", "-o", str(out)]) == 0
    assert [r.seq for r in read_export(out)] == list(range(450, 501))
    assert main(["events", "export", "--nats-url", nats_url, "--since", "yesterday", "-o", str(out)]) == 2


def test_a_bad_line_is_rejected_with_its_number_and_nothing_is_imported(
    nats_url: str, make_nats: Callable[..., EmbeddedNats], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    asyncio.run(_seed(nats_url, 50))
    good = tmp_path / "good.jsonl"
    assert main(["events", "export", "--nats-url", nats_url, "-o", str(good)]) == 0
    lines = good.read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([*lines[:30], '{"stream":"events","seq":31,"event":{"type":"nope"}}', *lines[31:]]) + "\n")
    fresh = make_nats("fresh").start()
    capsys.readouterr()
    assert main(["events", "import", "--nats-url", fresh.url, str(bad)]) == 2
    assert "bad.jsonl:31:" in capsys.readouterr().err
    assert asyncio.run(_count(fresh.url)) == 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not a valid event record"),
        ('{"stream":"events","seq":0,"event":null}', "not a valid event record"),
        ("SEQ_BACKWARDS", "does not follow"),
        ("WRONG_STREAM", "cannot belong to stream"),
        ("SUBJECT_OFF_STREAM", "is not one of stream 'events'"),
    ],
)
def test_read_export_names_the_bad_line(tmp_path: Path, line: str, reason: str) -> None:
    from events.codec import ExportRecord, encode_record

    events = synthetic_history(3)
    good = [encode_record(ExportRecord(stream="events", seq=i, event=e)).decode() for i, e in enumerate(events, 1)]
    if line == "SEQ_BACKWARDS":
        line = encode_record(ExportRecord(stream="events", seq=2, event=events[0])).decode()
    if line == "WRONG_STREAM":
        line = encode_record(ExportRecord(stream="telemetry", seq=9, event=events[0])).decode()
    if line == "SUBJECT_OFF_STREAM":  # an import would publish it where no stream stores it
        record = ExportRecord(stream="events", seq=9, event=events[0], subject="shoal.hb.node.n1")
        line = encode_record(record).decode()
    path = tmp_path / "x.jsonl"
    path.write_text("\n".join([*good, line]) + "\n")
    with pytest.raises(BadExportLine) as caught:
        read_export(path)
    assert caught.value.line == 4 and reason in str(caught.value)


def test_fold_export_equals_the_fold_of_the_events(tmp_path: Path) -> None:
    from eventlog.export import write_export
    from events.codec import ExportRecord
    from events.fold import fold

    events = synthetic_history(1000)
    path = tmp_path / "log.jsonl"
    with path.open("wb") as out:
        write_export((ExportRecord(stream="events", seq=i, event=e) for i, e in enumerate(events, 1)), out)
    assert fold_export(path) == fold(enumerate(events, 1))


def test_an_export_that_starts_mid_stream_keeps_its_numbering_through_import(
    nats_url: str, make_nats: Callable[..., EmbeddedNats], tmp_path: Path
) -> None:
    asyncio.run(_seed(nats_url, 300))
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    assert main(["events", "export", "--nats-url", nats_url, "--since", "101", "-o", str(first)]) == 0
    fresh = make_nats("fresh").start()
    assert main(["events", "import", "--nats-url", fresh.url, str(first)]) == 0
    assert main(["events", "export", "--nats-url", fresh.url, "-o", str(second)]) == 0
    assert first.read_bytes() == second.read_bytes()
    assert read_export(second)[0].seq == 101
    assert read_export(second)[-1].seq == 300


def test_an_imported_forgery_stays_quarantined(make_nats: Callable[..., EmbeddedNats], tmp_path: Path) -> None:
    """An export keeps the subject the server checked when each event was published; the import
    stores each event on it again. Stored on its own claimed subject instead (`subject_for`), the
    chunk node n1's runner forged as n2's rank 1 would have passed the fold once imported."""
    from eventlog.export import write_export
    from events.apply import Misrouted
    from events.codec import ExportRecord
    from events.fold import Folder
    from events.subjects import subject_for
    from tests.events.builders import Events

    ev = Events()
    history = [ev.node("n1"), ev.node("n2"), ev.placed("i1"), ev.created("t1"), ev.assigned("t1", "i1")]
    records = [ExportRecord(stream="events", seq=i, event=e, subject=subject_for(e)) for i, e in enumerate(history, 1)]
    forged = ev.chunk("t1", text="forged")  # stamped as n2's rank 1, the sampling rank
    on_n1 = "shoal.ev.task.t1.chunk_generated.n1"  # where n1's runner could publish it
    records.append(ExportRecord(stream="events", seq=len(records) + 1, event=forged, subject=on_n1))
    path = tmp_path / "forged.jsonl"
    with path.open("wb") as out:
        write_export(records, out)
    fresh = make_nats("fresh").start()
    assert main(["events", "import", "--nats-url", fresh.url, str(path)]) == 0

    async def refold() -> Folder:
        log = await EventLog.connect(fresh.url)
        try:
            folder = Folder()
            async for seq, event, subject in log.deliveries(None, None, stream="events", live=False):
                assert event is not None
                folder.add(seq, event, subject)
            return folder
        finally:
            await log.close()

    folder = asyncio.run(refold())
    assert [(q.seq, q.error) for q in folder.state.quarantined] == [(6, Misrouted.__name__)]
    assert folder.state.tasks[forged.task_id].text == ""


def test_since_takes_a_seq_or_an_iso_time_and_tail_lines_are_readable() -> None:
    from datetime import UTC, datetime

    from services.commands.events_cmd import describe, parse_since

    assert parse_since("42") == (42, None)
    assert parse_since(None) == (None, None)
    _, when = parse_since("2025-01-31T12:00:00Z")
    assert when == datetime(2025, 1, 31, 12, tzinfo=UTC)
    with pytest.raises(ValueError, match="sequence number or an ISO time"):
        parse_since("last tuesday")
    line = describe(7, synthetic_history(3)[2])
    assert line.split()[0] == "7" and "instance_placed" in line and 'model="tiny"' in line
    assert line.endswith("[master]")
