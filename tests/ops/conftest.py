from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from events.codec import encode_record
from services.ops.synthetic import LogBuilder


def write_log(path: Path, log: LogBuilder, tail: bytes = b"") -> Path:
    with path.open("wb") as out:
        for record in log.records:
            out.write(encode_record(record) + b"\n")
        out.write(tail)
    return path


@pytest.fixture
def export_file(tmp_path: Path) -> Callable[..., Path]:
    def make(log: LogBuilder, tail: bytes = b"", name: str = "log.jsonl") -> Path:
        return write_log(tmp_path / name, log, tail)

    return make
