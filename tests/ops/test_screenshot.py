"""The timeline page must draw, not only serve: render it in headless Chromium and look at pixels.

Needs Debian's `chromium` (`apt-get update && apt-get install -y chromium`); skipped without it.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from services.ops.offline import diagnose_scan, findings_for_task
from services.ops.render_html import RANK_COLOURS, render_timeline_html
from services.ops.scan import scan
from services.ops.timeline import TimelineBuilder
from tests.ops import scenarios

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB(A) rows of an 8-bit non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        rows.append(bytes(line if channels == 3 else bytes(b for j, b in enumerate(line) if j % 4 != 3)))
        previous = line
    return width, height, rows


def count_colour(rows: list[bytes], hex_colour: str) -> int:
    rgb = bytes.fromhex(hex_colour.lstrip("#"))
    return sum(row[i : i + 3] == rgb for row in rows for i in range(0, len(row), 3))


@pytest.mark.timeout(90)
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed: apt-get update && apt-get install -y chromium")
def test_headless_chromium_draws_the_waterfall(tmp_path: Path) -> None:
    assert CHROMIUM is not None
    log = scenarios.compute_stall()
    builder = TimelineBuilder("t1")  # type: ignore[arg-type]
    result = scan(enumerate(log.records, 1), observers=[builder])
    page = tmp_path / "timeline.html"
    page.write_text(render_timeline_html(builder.build(), findings_for_task(diagnose_scan(result), "t1")))
    shot = tmp_path / "timeline.png"
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1280,800",
        page.as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=60)
    width, height, rows = decode_png(shot.read_bytes())
    assert (width, height) == (1280, 800)
    # Both ranks' chunk bars and the hatched "stopped here" region are painted.
    assert count_colour(rows, RANK_COLOURS[0]) > 500
    assert count_colour(rows, RANK_COLOURS[1]) > 500
    assert count_colour(rows, "#fee2e2") > 500
