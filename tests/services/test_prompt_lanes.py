"""Prompts are sized (templated and tokenized) in two lanes (`services/api/prompt_lanes.py`): a
burst of long prompts, refused in the end, no longer holds up everyone else's short request."""

from __future__ import annotations

import time

import anyio
import pytest

from eventlog.log import EventLog
from events.catalogue import ChatMessage
from events.constraints import ToolFunction
from services.api.auth import ApiAccess, parse_entries
from services.api.prompt_lanes import SHORT_PROMPT_CHARS, is_short, prompt_chars
from services.config import ShoalConfig
from tests.events.builders import Events
from tests.services.test_api import Client, chat
from tests.services.test_api_admission import ALICE, BOB, api_with, keyed

pytestmark = pytest.mark.timeout(120)

LONG_REQUESTS = 48  # more than anyio's default pool of 40 threads, which every prompt shared before


def test_a_prompt_is_short_up_to_its_bound_in_characters() -> None:
    assert is_short(prompt_chars([ChatMessage(role="user", content="hi")], [], None))
    assert not is_short(prompt_chars([ChatMessage(role="user", content="x" * SHORT_PROMPT_CHARS)], [], None))
    many = [ChatMessage(role="user", content="a b")] * 2_000  # short messages add up
    assert not is_short(prompt_chars(many, [], None))
    schema = '{"type": "object", "description": "' + "y" * SHORT_PROMPT_CHARS + '"}'
    assert not is_short(prompt_chars([], [ToolFunction(name="f", parameters=schema)], None))  # tools count
    assert not is_short(prompt_chars([], [], "z" * (SHORT_PROMPT_CHARS + 1)))  # a completion's prompt
    assert is_short(prompt_chars([], [], [1, 2, 3]))  # token ids: no tokenizing


async def test_a_short_request_is_not_held_up_by_a_burst_of_long_prompts(event_log: EventLog) -> None:
    await event_log.append(Events().node("n1"))
    async with (
        api_with(event_log, ShoalConfig(max_queued_tasks=200)) as (_ctx, app),
        anyio.create_task_group() as group,
    ):
        warm = Client("POST", "/v1/chat/completions", chat(stream=True))
        group.start_soon(warm.run, app)
        with anyio.fail_after(40):  # the first request loads the tokenizer (transformers: seconds)
            await warm.started.wait()
        long_body = {**chat(stream=False), "messages": [{"role": "user", "content": "a b"}] * 2_000}
        longs = [Client("POST", "/v1/chat/completions", long_body) for _ in range(LONG_REQUESTS)]
        for client in longs:
            group.start_soon(client.run, app)
        await anyio.sleep(0.05)  # every long one is in, its prompt being sized or waiting to be
        short = Client("POST", "/v1/chat/completions", chat(stream=True))
        began = time.monotonic()
        group.start_soon(short.run, app)
        with anyio.fail_after(60):
            await short.started.wait()  # sized, checked and published
        waited = time.monotonic() - began
        ended_before = sum(client.done.is_set() for client in longs)
        with anyio.fail_after(60):
            for client in longs:
                await client.done.wait()
        assert all(client.status == 400 for client in longs)  # 18,000 tokens: over the tiny model's 4,096
        assert "context" in longs[0].texts[0]
        # Before the lanes, the short one waited for a thread behind 40 long ones sized at once.
        assert ended_before < LONG_REQUESTS // 4, (ended_before, waited)
        assert short.status == 200
        for client in (warm, short):
            client.disconnect()


async def test_one_keys_burst_of_long_prompts_does_not_hold_up_another_keys_long_prompt(
    event_log: EventLog,
) -> None:
    """Alice sends 24 long prompts, then Bob one: Bob's is sized on the first thread a prompt of
    Alice's frees (`fair_lane.FairLane`), not after all of hers, as when the lane was first come,
    first served. Every one of them is refused in the end (over the context): what is timed is when."""
    await event_log.append(Events().node("n1"))
    access = ApiAccess(parse_entries([ALICE, BOB]))
    config = ShoalConfig(max_queued_tasks=200, max_queued_tasks_per_key=100)
    async with api_with(event_log, config, access) as (_ctx, app), anyio.create_task_group() as group:
        warm = keyed(BOB, chat(stream=True))
        group.start_soon(warm.run, app)
        with anyio.fail_after(40):  # the first request loads the tokenizer (transformers: seconds)
            await warm.started.wait()
        long_body = {**chat(stream=False), "messages": [{"role": "user", "content": "a b"}] * 2_000}
        alices = [keyed(ALICE, long_body) for _ in range(24)]
        for client in alices:
            group.start_soon(client.run, app)
        await anyio.sleep(0.05)  # every one of hers is in, its prompt being sized or waiting to be
        bobs = keyed(BOB, long_body)
        group.start_soon(bobs.run, app)
        with anyio.fail_after(60):
            await bobs.done.wait()
        ended_before = sum(client.done.is_set() for client in alices)
        with anyio.fail_after(60):
            for client in alices:
                await client.done.wait()
        assert bobs.status == 400 and all(client.status == 400 for client in alices)
        assert ended_before <= 6, ended_before  # first come, first served: about 22 (2 threads)
        warm.disconnect()
