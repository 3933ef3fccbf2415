"""A client of a cluster across hosts that never waits unbounded: one streamed chat completion,
what it received and how it ended (the fault tests' checker compares it with the log; the netem
bench times it)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class ClientCall:
    """One streamed chat request as the client saw it."""

    task_id: str = ""  # from x-shoal-task-id: the API acknowledged the task's TaskCreated
    text: str = ""
    outcome: str = ""  # completed | failed | refused | hung | broken
    error: str = ""
    status: int = 0
    seconds: float = 0.0
    progress_seen: int = 0
    first_text_seconds: float | None = None  # since the request was sent: the time to first token
    last_text_seconds: float | None = None


def stream_chat(
    http: httpx.Client,
    prompt: str,
    max_tokens: int,
    *,
    bound_seconds: float,
    on_event: Callable[[ClientCall], None] | None = None,
    model: str = "tiny",
) -> ClientCall:
    """Stream one chat completion, giving up (outcome `hung`) after `bound_seconds` in all; `on_event`
    sees the call after every SSE event (the fault tests inject from there, mid-prefill or mid-decode)."""
    call = ClientCall()
    started = time.monotonic()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_progress": True},
    }
    try:
        with http.stream("POST", "/v1/chat/completions", json=body, timeout=min(bound_seconds, 30.0)) as response:
            call.status = response.status_code
            call.task_id = response.headers.get("x-shoal-task-id", "")
            if response.status_code != 200:
                call.outcome, call.error = "refused", response.read().decode(errors="replace")[:500]
                return call
            for line in response.iter_lines():
                if time.monotonic() - started > bound_seconds:
                    call.outcome = "hung"
                    return call
                had = len(call.text)
                _take(call, line)
                if len(call.text) > had:
                    call.last_text_seconds = time.monotonic() - started
                    call.first_text_seconds = call.first_text_seconds or call.last_text_seconds
                if on_event is not None and line.startswith("data: "):
                    on_event(call)
                if call.outcome:
                    break
    except httpx.TimeoutException as exc:
        call.outcome, call.error = "hung", f"no byte for a read timeout: {exc!r}"
    except httpx.HTTPError as exc:
        call.outcome, call.error = "broken", repr(exc)
    finally:
        call.seconds = time.monotonic() - started
    if not call.outcome:
        call.outcome, call.error = "broken", call.error or "stream ended without [DONE]"
    return call


def _take(call: ClientCall, line: str) -> None:
    if not line.startswith("data: "):
        return
    payload = line.removeprefix("data: ")
    if payload == "[DONE]":
        call.outcome = call.outcome or "completed"
        return
    chunk: dict[str, Any] = json.loads(payload)
    if "error" in chunk:
        call.outcome, call.error = "failed", str(chunk["error"].get("message", chunk["error"]))
        return
    if chunk.get("prompt_progress"):
        call.progress_seen += 1
    for choice in chunk.get("choices") or []:
        call.text += (choice.get("delta") or {}).get("content") or ""


def stream_in_thread(
    http_factory: Callable[[], httpx.Client], prompt: str, max_tokens: int, bound: float, model: str = "tiny"
) -> Any:
    """Start `stream_chat` on a thread (load while a test injects a fault); `.join()` then `.result`."""

    class Runner(threading.Thread):
        result: ClientCall = ClientCall(outcome="hung")

        def run(self) -> None:
            with http_factory() as http:
                self.result = stream_chat(http, prompt, max_tokens, bound_seconds=bound, model=model)

    runner = Runner(daemon=True)
    runner.start()
    return runner
