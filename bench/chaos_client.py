"""The chaos run's clients: each request of the workload (`bench/chaos_schedule.py`) sent the way
its kind says — streamed, answered whole, streamed then cancelled by closing it, or streamed with
a JSON schema — and recorded as its client saw it (`ClientRecord`), never waiting past its bound.

A connection can die without a word: the API killed while a partition swallowed its FIN, then
restarted; the client, which only reads, never sends the byte that would draw a reset, so it would
wait out its bound (the whole run: a 60-minute run counted three such calls as hung). The API
sends a stream an SSE comment whenever it has been silent for `KEEPALIVE_S`, so a streaming client
that hears nothing for `SILENCE_INTERVALS` of them has lost its connection: it gives up on that
call (outcome `silent`), as a real client behind a proxy would. The same read timeout covers the
wait for the response's head, which the API sends within the log's retry time even while NATS is
away (a 503 then), so `SILENCE_S` is longer than that too. A call answered whole hears nothing
until its answer: TCP keepalive probes (`TCP_KEEPALIVE`) find a dead connection under it."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from bench.chaos_check import ClientRecord
from bench.chaos_schedule import RequestSpec
from bench.cluster import long_prompt

KEEPALIVE_S = 10.0  # the chaos cluster's sse_keepalive_seconds (`bench/chaos.py` sets it)
SILENCE_INTERVALS = 5
SILENCE_S = SILENCE_INTERVALS * KEEPALIVE_S  # a stream that heard nothing for this long is dead
# Probes once a connection has been idle for SILENCE_S: unanswered ones reset it (a dead host), a
# restarted peer answers the first with a reset. A stream hears its keepalives long before.
TCP_KEEPALIVE = [
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, int(SILENCE_S)),
    (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, int(KEEPALIVE_S)),
    (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3),
]

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def body_of(spec: RequestSpec) -> dict[str, Any]:
    prompt = long_prompt(spec.prompt_words) if spec.prompt_words > 50 else " ".join(["Tell me"] * spec.prompt_words)
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": spec.max_tokens,
        "stream": spec.kind != "plain",
    }
    if spec.kind == "structured":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    return body


def send(
    http: httpx.Client,
    spec: RequestSpec,
    *,
    bound: float,
    clock: Callable[[], float],
    silence: float = SILENCE_S,
) -> ClientRecord:
    """One request; `clock` gives seconds since the chaos started (the records' time base). A
    streamed one gives up once the connection sent nothing for `silence` seconds."""
    record = ClientRecord(number=spec.number, kind=spec.kind, key=spec.key, started=clock(), bound=bound)
    deadline = time.monotonic() + bound
    try:
        if spec.kind == "plain":
            _plain(http, spec, record, bound)
        else:
            _stream(http, spec, record, deadline, silence)
    except httpx.ReadTimeout as exc:
        if spec.kind == "plain" or time.monotonic() >= deadline:
            record.outcome, record.error = "hung", f"no answer within the bound: {exc!r}"
        else:
            record.outcome, record.error = "silent", f"connection silent for {silence:g}s (not even a keepalive)"
    except httpx.TimeoutException as exc:
        record.outcome, record.error = "hung", f"no byte within the bound: {exc!r}"
    except httpx.HTTPError as exc:
        record.outcome, record.error = "broken", repr(exc)
    finally:
        record.ended = clock()
    return record


def _plain(http: httpx.Client, spec: RequestSpec, record: ClientRecord, bound: float) -> None:
    response = http.post("/v1/chat/completions", json=body_of(spec), timeout=bound)
    record.status, record.task_id = response.status_code, response.headers.get("x-shoal-task-id", "")
    if response.status_code == 200:
        record.text = response.json()["choices"][0]["message"]["content"] or ""
        record.outcome = "completed"
    else:
        record.outcome = "failed" if record.task_id else "refused"
        record.error = response.text[:500]


def _stream(http: httpx.Client, spec: RequestSpec, record: ClientRecord, deadline: float, silence: float) -> None:
    left = deadline - time.monotonic()
    timeout = httpx.Timeout(left, read=min(silence, left))  # read: the longest wait for any byte
    with http.stream("POST", "/v1/chat/completions", json=body_of(spec), timeout=timeout) as r:
        record.status, record.task_id = r.status_code, r.headers.get("x-shoal-task-id", "")
        if r.status_code != 200:
            record.outcome = "failed" if record.task_id else "refused"
            record.error = r.read().decode(errors="replace")[:500]
            return
        for line in r.iter_lines():
            if time.monotonic() > deadline:
                record.outcome, record.error = "hung", "the stream went on past the bound"
                return
            if _take(record, line):
                return
            if spec.kind == "cancel" and len(record.text) >= spec.cancel_after_chars:
                record.outcome = "cancelled"  # leaving the block closes the stream: the API cancels the task
                return
    record.outcome, record.error = "broken", "the stream ended without [DONE]"


def _take(record: ClientRecord, line: str) -> bool:
    """Take one SSE line; True once the stream is over."""
    if not line.startswith("data: "):
        return False
    payload = line.removeprefix("data: ")
    if payload == "[DONE]":
        record.outcome = "completed"
        return True
    chunk: dict[str, Any] = json.loads(payload)
    if "error" in chunk:
        record.outcome, record.error = "failed", str(chunk["error"].get("message", chunk["error"]))
        return True
    for choice in chunk.get("choices") or []:
        record.text += (choice.get("delta") or {}).get("content") or ""
    return False


class Clients:
    """`count` threads sending the workload until `stop()`; `records` holds every finished call."""

    def __init__(
        self,
        http_for: Callable[[int], httpx.Client],
        specs: Iterator[RequestSpec],
        *,
        count: int,
        bound: float,
        clock: Callable[[], float],
    ) -> None:
        self.records: list[ClientRecord] = []
        self._http_for, self._specs, self._bound, self._clock = http_for, specs, bound, clock
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _next(self) -> RequestSpec:
        with self._lock:
            return next(self._specs)

    def _run(self) -> None:
        while not self._stopping.is_set():
            spec = self._next()
            with self._http_for(spec.key) as http:
                record = send(http, spec, bound=self._bound, clock=self._clock)
            with self._lock:
                self.records.append(record)
            if record.outcome in ("refused", "broken", "hung", "silent"):
                self._stopping.wait(1.0)  # no tight loop against an API that is down

    def stop_sending(self) -> None:
        """Start no more calls (those in flight go on)."""
        self._stopping.set()

    def stop(self) -> list[ClientRecord]:
        """Send no more; wait for the calls in flight (each ends within its bound)."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(self._bound + 10)
        with self._lock:
            return sorted(self.records, key=lambda r: r.number)
