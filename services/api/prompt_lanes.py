"""The worker threads that check grammars and size prompts before their task is published, in
lanes, so that a short prompt never waits behind long ones and a burst of large grammars never
freezes the event loop.

A request's prompt is counted in tokens before its task is published (`prompts.prompt_tokens`:
the chat template rendered, then tokenized), so that one too long for the model is refused at
once. A long prompt holds a thread for a while (9,000 short messages: 0.3 s on the tiny model's
tokenizer). On anyio's one shared pool of 40 threads a burst of them, from one client and refused
in the end, left everyone else's request behind them: with 60 such bodies in flight a two-word
chat took 21 s to answer.

Now a prompt of up to `SHORT_PROMPT_CHARS` characters is sized in the short lane and a longer one
in the long lane, each with threads of its own. A burst of long prompts waits behind itself,
`LONG_LANE_THREADS` at a time (about what two cores give anyway), while every short prompt is sized
at once; and a lane's waiters are served by API key in turn (`fair_lane.py`), so one key's burst of
long prompts (or of grammars, below) holds another key's request back only until a thread frees.
A prompt of token ids is only checked against the vocabulary: short.

A request's grammar (tools, a response format) is built and checked before that, in a lane of its
own too (`grammars`, `GRAMMAR_LANE_THREADS`): a large JSON schema holds a thread for a good part of
a second, much of it holding the GIL. On the shared pool, 30 of them at once froze the event loop,
so every client's stream, for up to 2 s at a time; two at a time, for at most tens of milliseconds,
and the burst takes as long in all.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from events.catalogue import ChatMessage, RawPrompt
from events.constraints import ToolFunction
from events.ids import KeyId
from services.api.fair_lane import FairLane
from services.api.prompts import PromptModel, prompt_tokens

SHORT_PROMPT_CHARS = 16_384  # about 4,000 tokens: tokenized in milliseconds
SHORT_LANE_THREADS = 8
LONG_LANE_THREADS = 2
GRAMMAR_LANE_THREADS = 2


def prompt_chars(messages: Sequence[ChatMessage], tools: Sequence[ToolFunction], raw_prompt: RawPrompt | None) -> int:
    """What the template renders, in characters of JSON: the messages (tool calls included) and the
    tools, or the raw prompt; a list of token ids counts one per id."""
    if isinstance(raw_prompt, list):
        return len(raw_prompt)
    if raw_prompt is not None:
        return len(raw_prompt)
    return len(msgspec.json.encode(messages)) + (len(msgspec.json.encode(tools)) if tools else 0)


def is_short(chars: int) -> bool:
    return chars <= SHORT_PROMPT_CHARS


class PromptLanes:
    """The lanes of one API: `size` runs `prompt_tokens` on a thread of the prompt's lane (short or
    long); `grammars` is the lane where requests' grammars are checked (`schemas.to_task_off_loop`).
    Each lane takes its waiters by API key in turn (`fair_lane.FairLane`)."""

    def __init__(
        self,
        short_threads: int = SHORT_LANE_THREADS,
        long_threads: int = LONG_LANE_THREADS,
        grammar_threads: int = GRAMMAR_LANE_THREADS,
    ) -> None:
        self._short = FairLane(short_threads)
        self._long = FairLane(long_threads)
        self.grammars = FairLane(grammar_threads)

    async def size(
        self,
        key: KeyId,
        model: PromptModel | None,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolFunction],
        raw_prompt: RawPrompt | None,
        enable_thinking: bool | None = None,
    ) -> int:
        """The prompt's tokens (`prompt_tokens`), its 400s included, sized in `key`'s turn."""
        lane = self._short if is_short(prompt_chars(messages, tools, raw_prompt)) else self._long
        return await lane.run_sync(key, prompt_tokens, model, messages, tools, raw_prompt, enable_thinking)
