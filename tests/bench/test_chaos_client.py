"""The chaos client gives up on a connection that went silent, within its silence and long before
its call's bound, and not on one that is only slow: against a real HTTP server on a loopback socket
that sends a scripted stream and then holds the connection open without a byte — what a client
sees of a connection that died without a word (the API killed while a partition swallowed its
FIN). The cluster's side, a keepalive on every silent stream, is `tests/services/test_api_keepalive.py`."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from bench.chaos_check import ClientRecord
from bench.chaos_client import KEEPALIVE_S, SILENCE_S, send
from bench.chaos_schedule import RequestSpec
from eventlog.streams import LogSettings

pytestmark = pytest.mark.timeout(60)
SILENCE = 0.5  # the test's silence: short, so the test is quick
BOUND = 50.0  # the call's bound, which a dead connection used to take whole
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-shoal-task-id: t1\r\ntransfer-encoding: chunked\r\n\r\n"
)
KEEPALIVE = b": keepalive\n\n"
ONCE = b'data: {"choices":[{"delta":{"content":"Once"}}]}\n\n'
DONE = b"data: [DONE]\n\n"

Script = list[tuple[float, bytes]]  # (seconds to wait, SSE bytes to send), after the head


def _chunk(part: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(part), part)


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += conn.recv(65536)


def _serve(listener: socket.socket, head: bool, script: Script, end: bool, release: threading.Event) -> None:
    conn, _ = listener.accept()
    with conn:
        _read_request(conn)
        if head:
            conn.sendall(HEAD)
        for wait, part in script:
            time.sleep(wait)
            conn.sendall(_chunk(part))
        if end:
            conn.sendall(b"0\r\n\r\n")
        release.wait(BOUND)  # silent, the connection open: the client must give up by itself


@contextmanager
def server(script: Script, *, head: bool = True, end: bool = False) -> Iterator[httpx.Client]:
    """A client of a one-request server that sends `HEAD` (if `head`), then `script`, then the end
    of the body (if `end`), then nothing."""
    release = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        thread = threading.Thread(target=_serve, args=(listener, head, script, end, release), daemon=True)
        thread.start()
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
                yield http
        finally:
            release.set()
            thread.join(10)


def _stream(http: httpx.Client) -> tuple[float, ClientRecord]:
    started = time.monotonic()
    record = send(http, RequestSpec(1, 0, "stream", 3, 8), bound=BOUND, clock=time.monotonic, silence=SILENCE)
    return time.monotonic() - started, record


@pytest.mark.parametrize(
    ("head", "script", "text"),
    [
        (True, [(0.0, KEEPALIVE), (0.0, ONCE)], "Once"),
        (True, [], ""),
        (False, [], ""),
    ],
    ids=["after-a-token", "after-the-head", "before-the-head"],
)
def test_a_stream_gone_silent_fails_that_call_within_its_silence(head: bool, script: Script, text: str) -> None:
    with server(script, head=head) as http:
        took, record = _stream(http)
    assert record.outcome == "silent", record
    assert record.error == f"connection silent for {SILENCE:g}s (not even a keepalive)"
    assert record.text == text and record.task_id == ("t1" if head else "")
    assert SILENCE <= took < BOUND / 2, took  # it waited its silence, not its bound


def test_a_stream_that_keeps_sending_keepalives_is_waited_for_past_the_silence() -> None:
    """The limit is on silence, not on the call's length: keepalives for several silences, then the answer."""
    keepalives = [(SILENCE / 2, KEEPALIVE)] * 6
    with server([*keepalives, (0.0, ONCE), (0.0, DONE)], end=True) as http:
        took, record = _stream(http)
    assert record.outcome == "completed" and record.text == "Once", record
    assert took >= 3 * SILENCE


def test_the_silence_is_a_few_keepalives_and_outlasts_the_apis_wait_for_the_log() -> None:
    """Before the head, the API may wait for NATS up to the log's retry time (then answers 503):
    the client's silence must not cut that wait short."""
    assert 3 * KEEPALIVE_S <= SILENCE_S <= 6 * KEEPALIVE_S
    assert LogSettings().retry_seconds + KEEPALIVE_S < SILENCE_S
