"""Closing a connection whose socket broke meanwhile is a close, not an error (a runner's log
bridge crashed on `ETIMEDOUT` from nats-py's close after a partition, in a chaos run)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from nats.aio.client import Client

from eventlog.client import NatsClient, Reconnects


class BrokenOnClose:
    is_connected = False
    is_closed = False

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.closes = 0

    async def close(self) -> None:
        self.closes += 1
        raise self.error


def _client(nc: Any) -> NatsClient:
    return NatsClient(cast(Client, nc), None, asyncio.Event(), Reconnects())


def test_a_socket_that_timed_out_under_the_close_is_closed_quietly() -> None:
    nc = BrokenOnClose(TimeoutError(110, "Connection timed out"))
    asyncio.run(_client(nc).close())
    assert nc.closes == 1


def test_any_other_failure_of_the_close_still_surfaces() -> None:
    nc = BrokenOnClose(RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        asyncio.run(_client(nc).close())
