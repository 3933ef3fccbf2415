"""Hub ids: their shape, the cache lookup on a real Hub-cache layout, the clear error when an id
is neither cached nor reachable (downloads pointed at a closed local port), and the download
progress plumbing (huggingface_hub's tqdm hook, driven by a real chunked file copy)."""

from __future__ import annotations

import http.server
import shutil
import threading
import time
from pathlib import Path

import pytest
from huggingface_hub import constants

from runner.models.hub import (
    ModelUnavailableError,
    ProgressThrottle,
    hub_config,
    hub_owner,
    hub_snapshot,
    hub_unreachable,
    is_hub_id,
    reporting_bar_class,
)
from runner.models.resolve import resolve_model
from tests.e2e.cluster import free_port
from tests.hub_cache import install_in_hub_cache


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache, and downloads sent to a local port nothing listens on."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return cache


def _model_files(tmp_path: Path) -> Path:
    source = tmp_path / "source"
    source.mkdir()
    (source / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 6}')
    (source / "model.safetensors").write_bytes(b"\0" * 64)
    return source


@pytest.mark.parametrize(
    ("reference", "hub"),
    [
        ("mlx-community/Llama-3.2-1B-Instruct-4bit", True),
        ("owner/name", True),
        ("Qwen/Qwen2.5-0.5B", True),
        ("tiny", False),
        ("/models/llama", False),
        ("owner/name/extra", False),
        ("../name", False),
        ("owner/..", False),
        ("owner/a..b", False),
        (".owner/name", False),
        ("owner/-name", False),
        ("own--er/name", False),
        ("owner/na me", False),
        ("owner/", False),
        ("~/models", False),
    ],
)
def test_a_hub_id_is_owner_slash_name_and_nothing_that_escapes_a_path(reference: str, hub: bool) -> None:
    assert is_hub_id(reference) is hub
    assert hub_owner(reference) == (reference.split("/")[0] if hub else None)


def test_a_cached_id_resolves_to_its_snapshot_without_the_network(hub_cache: Path, tmp_path: Path) -> None:
    snapshot = install_in_hub_cache(hub_cache, "owner/name", _model_files(tmp_path))
    assert hub_snapshot("owner/name", allow_download=False) == snapshot
    assert resolve_model("owner/name", allow_download=False) == snapshot
    assert hub_config("owner/name", allow_download=False) == snapshot / "config.json"


def test_a_directory_wins_over_a_hub_id_of_the_same_spelling(
    hub_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copytree(_model_files(tmp_path), tmp_path / "owner" / "name")
    assert resolve_model("owner/name", allow_download=False) == Path("owner/name")


def test_an_uncached_id_that_cannot_be_downloaded_says_where_it_looked_and_what_to_do(hub_cache: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ModelUnavailableError) as raised:
        hub_snapshot("owner/missing", allow_download=True)
    message = str(raised.value)
    assert "'owner/missing' is neither in the Hugging Face cache" in message
    assert str(hub_cache) in message
    assert f"the Hub at {constants.ENDPOINT} cannot be reached" in message
    assert "hf download owner/missing" in message
    with pytest.raises(ModelUnavailableError, match="cannot be reached"):
        hub_config("owner/missing", allow_download=True)
    # huggingface_hub alone retries a refused connection for ~23 s per call
    assert time.monotonic() - started < 10


def test_an_unreachable_hub_reads_a_cached_config_at_once(hub_cache: Path, tmp_path: Path) -> None:
    snapshot = install_in_hub_cache(hub_cache, "owner/name", _model_files(tmp_path))
    started = time.monotonic()
    assert hub_config("owner/name", allow_download=True) == snapshot / "config.json"
    assert time.monotonic() - started < 10


def test_a_hub_that_answers_is_reachable_whatever_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any HTTP answer (here a 404 from a local server) leaves the download to huggingface_hub."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
        assert hub_unreachable() is None
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
        assert "cannot be reached" in (hub_unreachable() or "")
    finally:
        server.shutdown()
        thread.join(5)


def test_downloads_off_refuses_before_any_network(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ModelUnavailableError, match="downloads are off"):
        hub_snapshot("owner/missing", allow_download=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelUnavailableError, match="downloads are off"):
        hub_snapshot("owner/missing", allow_download=True)
    with pytest.raises(ModelUnavailableError, match=r"config\.json could not be read"):
        hub_config("owner/missing", allow_download=True)


def test_the_throttle_lets_one_report_through_per_interval_and_always_the_last() -> None:
    now = [0.0]
    throttle = ProgressThrottle(2.0, clock=lambda: now[0])
    passed: list[int] = []
    for step in range(10):
        now[0] = step * 0.5
        if throttle.due(step, 10):
            passed.append(step)
    if throttle.due(10, 10):
        passed.append(10)
    assert passed == [0, 4, 8, 10]


def test_the_progress_bar_reports_the_bytes_of_a_real_copy(tmp_path: Path) -> None:
    """The bar huggingface_hub is handed, fed as its downloader feeds it: chunk by chunk."""
    source = tmp_path / "weights.bin"
    source.write_bytes(bytes(range(256)) * 1000)
    reports: list[tuple[int, int]] = []
    bar_class = reporting_bar_class(lambda done, total: reports.append((done, total)))
    total = source.stat().st_size
    with source.open("rb") as src, (tmp_path / "copy.bin").open("wb") as dst:
        bar = bar_class(total=total, unit="B", desc="Reconstructing (incomplete total...)")
        while chunk := src.read(64 * 1024):
            dst.write(chunk)
            bar.update(len(chunk))
        bar.close()
    files = bar_class(total=3, desc="Fetching 3 files")  # the file-count bar: not bytes, not reported
    files.update(1)
    files.close()
    assert reports[-1] == (total, total)
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    assert len(reports) == -(-total // (64 * 1024))
    assert (tmp_path / "copy.bin").read_bytes() == source.read_bytes()
