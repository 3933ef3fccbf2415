"""Read an export file (JSON Lines of `ExportRecord`) tolerantly.

An export copied off a dying cluster is often cut mid-line or has a corrupt tail. The operator
still wants everything before the damage, and must be told what was not used: so reading stops
at the first bad line, and `SkippedLines` says which line, why, and how many lines were left out.
Reading streams line by line, so a million-event file never sits in memory at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import msgspec

from events.codec import ExportRecord

# The same typed decoder as `events.codec.decode_record`, held here so the per-line loop calls it
# without a wrapper; built once, never mutated.
_RECORD_DECODER = msgspec.json.Decoder(ExportRecord)


class SkippedLines(msgspec.Struct, frozen=True, kw_only=True):
    """The first line that could not be used, why, and how many lines (it included) were left out."""

    line: int  # 1-based
    reason: str
    lines_not_used: int

    def describe(self) -> str:
        return f"line {self.line}: {self.reason}; {self.lines_not_used} line(s) from there on were not used"


class ExportReader:
    """Iterate `(line_number, record)` over an export file; stops at the first bad line.

    After iteration, `skipped` is None when every line was used. A consumer that finds a
    well-formed record it cannot use (a sequence gap, an unknown id) calls `abandon` from inside
    the loop, so the report covers that case in the same words.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped: SkippedLines | None = None
        self._file: BinaryIO | None = None

    def __iter__(self) -> Iterator[tuple[int, ExportRecord]]:
        # The hot loop of every offline command, one generator deep (no `yield from` hop per line):
        # the decoder is called directly (no wrapper call per line) and `abandon` is noticed
        # through `skipped` only after the consumer comes back.
        decode = _RECORD_DECODER.decode
        with self.path.open("rb") as file:
            self._file = file
            try:
                for number, line in enumerate(file, 1):
                    try:
                        record = decode(line)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        if line.isspace():
                            continue  # a blank line carries nothing to lose
                        truncated = not line.endswith(b"\n")
                        reason = f"truncated line ({exc})" if truncated else f"malformed record ({exc})"
                        self._stop(number, reason, file)
                        return
                    yield number, record
                    if self.skipped is not None:
                        return
            finally:
                self._file = None

    def abandon(self, line: int, reason: str) -> None:
        """Stop reading at `line` (already yielded) because its record cannot be used."""
        if self._file is None:
            raise RuntimeError("abandon() is only meaningful while iterating")
        self._stop(line, reason, self._file)

    def _stop(self, line: int, reason: str, file: BinaryIO) -> None:
        rest = sum(1 for _ in file)
        self.skipped = SkippedLines(line=line, reason=reason, lines_not_used=1 + rest)


class LoadedExport(msgspec.Struct, frozen=True, kw_only=True):
    records: list[ExportRecord]
    skipped: SkippedLines | None


def load_export(path: Path) -> LoadedExport:
    """Every usable record of a (small) export file in memory, plus what was skipped."""
    reader = ExportReader(path)
    records = [record for _, record in reader]
    return LoadedExport(records=records, skipped=reader.skipped)
