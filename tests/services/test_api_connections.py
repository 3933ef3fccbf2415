"""A silent or slow client holds at most its own connection (services/api/connections.py), tried
on a real uvicorn server with the guarded protocol: partial headers are cut at the deadline, a
client that sends its headers in time is served however long its request takes, a body that
trickles gets 408, and past the connection bound the connection that has waited longest for its
headers makes room."""

from __future__ import annotations

import asyncio
import resource
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from services.api.connections import connection_budget, guarded_protocol
from services.api.schemas import RequestProblem
from services.api.task_stream import read_body

pytestmark = pytest.mark.timeout(60)
DEADLINE_S = 0.5


async def _slow(request: Request) -> PlainTextResponse:
    await asyncio.sleep(float(request.query_params.get("s", "0")))
    return PlainTextResponse("ok")


@asynccontextmanager
async def serving(max_connections: int, app: Starlette | None = None) -> AsyncIterator[int]:
    async with server_on_port(max_connections, app) as (port, _server):
        yield port


@asynccontextmanager
async def server_on_port(
    max_connections: int, app: Starlette | None = None
) -> AsyncIterator[tuple[int, uvicorn.Server]]:
    app = app or Starlette(routes=[Route("/", _slow)])
    listener = socket.socket()  # protocol number 0, as a service manager may hand one over
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(
        app, http=guarded_protocol(max_connections, DEADLINE_S), log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield port, server
    finally:
        server.should_exit = True
        await task
        listener.close()


async def _partial_headers(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    await writer.drain()
    return reader, writer


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), seconds) == b""
    except TimeoutError:
        return False


async def test_partial_headers_are_cut_at_the_deadline_and_a_slow_request_is_not() -> None:
    async with serving(max_connections=1000) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        reader, writer = await _partial_headers(port)
        started = time.monotonic()
        slow = asyncio.create_task(http.get("/", params={"s": str(DEADLINE_S * 3)}))  # headers at once
        assert await _closed_within(reader, DEADLINE_S * 4)  # before: held for ever
        assert DEADLINE_S * 0.8 < time.monotonic() - started < DEADLINE_S * 4
        assert (await slow).text == "ok"  # past the deadline, but its headers came in time
        writer.close()
        # a kept-alive connection answered once, then silent in its next request's headers, is cut too
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"ok")).endswith(b"ok")
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
        assert await _closed_within(reader, DEADLINE_S * 4)  # before: the keep-alive timer was cancelled
        writer.close()


async def test_past_the_bound_the_oldest_silent_connection_makes_room() -> None:
    async with serving(max_connections=3) as port:
        silent = [await _partial_headers(port) for _ in range(3)]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            answer = await asyncio.wait_for(http.get("/"), DEADLINE_S / 2)  # before the deadline frees any
        assert answer.text == "ok"
        assert await _closed_within(silent[0][0], DEADLINE_S / 4)  # the oldest silent one went
        for _, writer in silent:
            writer.close()


def test_the_budget_leaves_descriptors_for_everything_else() -> None:
    budget = connection_budget()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == min(hard, 1 << 16)  # raised
    assert budget == max(64, soft - max(256, soft // 4))


async def _read_body_route(request: Request) -> PlainTextResponse:
    try:
        body = await read_body(request, limit=1_000_000, deadline_seconds=DEADLINE_S)
    except RequestProblem as problem:
        return PlainTextResponse(str(problem), status_code=problem.status)
    return PlainTextResponse(f"{len(body)} bytes")


async def test_a_body_sent_too_slowly_gets_408_and_the_connection_back() -> None:
    """Headers in time, then the body a byte at a time: before, it held its connection for ever."""
    app = Starlette(routes=[Route("/", _read_body_route, methods=["POST"])])
    async with serving(1000, app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(1000), DEADLINE_S * 4)
        assert answer.startswith(b"HTTP/1.1 408") and b"not received within 0.5s (1 bytes came)" in answer
        writer.close()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.post("/", content=b"x" * 1000)).text == "1000 bytes"  # a body sent at once


async def test_every_connection_sends_its_response_without_waiting_for_an_ack() -> None:
    """asyncio leaves Nagle on for a listener whose protocol number is 0: a kept-alive request's
    body then waited 44 ms for the client's delayed ACK of the headers."""
    async with server_on_port(max_connections=1000) as (port, server):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        (connection,) = server.server_state.connections
        sock = connection.transport.get_extra_info("socket")  # pyright: ignore[reportAttributeAccessIssue]
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        writer.close()
