"""A chunk that carries several tokens (the runner coalesces a task's chunks when the log is
behind) reaches the client whole: its text, and one logprob entry per token in order, in the
chat stream, the legacy completions stream and a non-streamed answer."""

from __future__ import annotations

import json

from events.catalogue import ChunkGenerated, TaskCompleted
from events.ids import TaskId
from events.logprobs import TokenLogprob, TopLogprob
from services.api.completions_format import TextChunkMaker
from services.api.hub import TaskEvents
from services.api.openai_format import ChunkMaker
from services.api.task_stream import collect
from tests.events.builders import Events

ev = Events()
TOKENS = ["Hel", "lo", ",", " wor", "ld"]
LOGPROBS = [
    TokenLogprob(token_id=i, token=t, logprob=-0.1 * (i + 1), top=[TopLogprob(token_id=i, token=t, logprob=-0.1)])
    for i, t in enumerate(TOKENS)
]


def _coalesced(index: int, tokens: range) -> ChunkGenerated:
    return ChunkGenerated(
        env=ev.task_rank("t1").stamp(),
        task_id=TaskId("t1"),
        index=index,
        text="".join(TOKENS[i] for i in tokens),
        token_ids=list(tokens),
        logprobs=[LOGPROBS[i] for i in tokens],
    )


def _data(sse: bytes) -> dict[str, object]:
    line = sse.decode().strip()
    assert line.startswith("data: ")
    parsed: dict[str, object] = json.loads(line.removeprefix("data: "))
    return parsed


def test_a_chat_chunk_of_several_tokens_streams_its_text_and_every_tokens_logprob() -> None:
    chunk = _coalesced(0, range(5))
    choice = _data(ChunkMaker("chatcmpl-t1", "tiny").content(chunk.text, chunk.logprobs))["choices"][0]  # type: ignore[index]
    assert choice["delta"]["content"] == "Hello, world"
    assert [entry["token"] for entry in choice["logprobs"]["content"]] == TOKENS


def test_a_text_completion_chunk_of_several_tokens_keeps_the_offsets_running() -> None:
    maker = TextChunkMaker("cmpl-t1", "tiny")
    first, second = _coalesced(0, range(3)), _coalesced(3, range(3, 5))
    shaped = [_data(maker.text(c.text, c.logprobs))["choices"][0]["logprobs"] for c in (first, second)]  # type: ignore[index]
    assert [t for lp in shaped for t in lp["tokens"]] == TOKENS
    assert [o for lp in shaped for o in lp["text_offset"]] == [0, 3, 5, 6, 10]


async def test_a_non_streamed_answer_collects_every_token_of_coalesced_chunks() -> None:
    events = TaskEvents()
    events.put(_coalesced(0, range(2)))
    events.put(_coalesced(2, range(2, 5)))
    events.put(TaskCompleted(env=ev.task_rank("t1").stamp(), task_id=TaskId("t1"), finish_reason="stop"))
    collected = await collect(events)
    assert collected.text == "Hello, world"
    assert collected.logprobs == LOGPROBS
