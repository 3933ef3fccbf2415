from __future__ import annotations

import re

from services.ops.offline import diagnose_scan, findings_for_task
from services.ops.render_html import render_timeline_html
from services.ops.render_text import diagnosis_text, state_text, timeline_text
from services.ops.scan import scan
from services.ops.timeline import TimelineBuilder, build_timeline
from tests.ops import scenarios
from tests.ops.test_timeline import pairs, pipelined


def stalled_page() -> str:
    log = scenarios.compute_stall()
    builder = TimelineBuilder("t1")  # type: ignore[arg-type]
    result = scan(enumerate(log.records, 1), observers=[builder])
    findings = findings_for_task(diagnose_scan(result), "t1")
    return render_timeline_html(builder.build(), findings)


def test_page_is_self_contained() -> None:
    page = stalled_page()
    assert page.startswith("<!doctype html>")
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert re.findall(r"https?://\S+", page) == ['http://www.w3.org/2000/svg"'] * page.count("<svg")


def test_page_draws_a_bar_per_chunk_lanes_markers_and_the_diagnosis() -> None:
    page = stalled_page()
    timeline = build_timeline("t1", pairs(scenarios.compute_stall()))
    bars = sum(len(lane.bars) for lane in timeline.lanes)
    svgs = page.count("<svg")
    assert svgs == 2  # the whole task, and prefill zoomed in (it is a sliver of a 40 s stall)
    assert page.count('class="bar"') == bars * svgs
    assert 'class="stuck"' in page and "rank 1 stopped here" in page
    assert "stalled_in_compute" in page and "llama.py" in page
    assert ">rank 0<" in page and ">rank 1<" in page and ">decode<" in page


def test_page_of_a_finished_task_shows_decode_and_cancel() -> None:
    timeline = build_timeline("t1", pairs(pipelined()))
    page = render_timeline_html(timeline, [])
    assert 'class="decode"' in page and ">cancel<" in page
    assert "No findings" in page


def test_user_text_is_escaped() -> None:
    log = scenarios.started()
    log.failed("t1", "<script>alert(1)</script>", rank=0)
    page = render_timeline_html(build_timeline("t1", pairs(log)), [])
    assert "<script>alert" not in page and "&lt;script&gt;" in page


def test_text_views() -> None:
    log = scenarios.compute_stall()
    text = timeline_text(build_timeline("t1", pairs(log)))
    assert "rank 1  iteration    3  chunk 3  768/2049 tokens  0.050s" in text
    assert "flight recorder: stuck in prefill" in text
    result = scan(enumerate(log.records, 1))
    diagnosis = diagnose_scan(result)
    assert "[stalled_in_compute] task t1" in diagnosis_text(diagnosis)
    from services.ops.offline import heartbeats_of

    state = state_text(result.state, heartbeats_of(result), result.newest_wall_ns)
    assert "t1  prefilling  i1  rank 0: 1024/2049 it 3  rank 1: 768/2049 it 3" in state
