"""Chat messages -> prompt token ids with the tokenizer's own chat template (no MLX).

Shared by the runner (which encodes the prompt it runs) and the API (which checks the same
prompt before publishing it), so both render tools and tool calls the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from events.catalogue import ChatMessage, RawPrompt
from events.constraints import ToolFunction


def encode_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    enable_thinking: bool | None = None,
) -> list[int]:
    """Apply the chat template (with the assistant generation prompt) and tokenize; a thinking
    switch, when given, goes to the template as `enable_thinking` (None: the template's default).

    Works with an mlx-lm TokenizerWrapper or a transformers tokenizer. A tokenizer without a
    chat template gets the messages' contents joined by newlines (and cannot be offered tools).
    """
    if getattr(tokenizer, "chat_template", None):
        switch = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        ids = tokenizer.apply_chat_template(
            list(messages), tools=list(tools) if tools else None, add_generation_prompt=True, tokenize=True, **switch
        )
        if isinstance(ids, Mapping):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer.encode("\n".join(str(m["content"]) for m in messages))]


def template_message(message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates read it: tool calls with their arguments as an object
    (`tool_call.arguments | tojson`), a tool result with the id of the call it answers."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def template_tools(tools: Sequence[ToolFunction]) -> list[dict[str, Any]]:
    """Tools in OpenAI's shape, which is what chat templates iterate over."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": json.loads(t.parameters)},
        }
        for t in tools
    ]


def encode_task_prompt(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolFunction],
    raw_prompt: RawPrompt | None,
    enable_thinking: bool | None = None,
) -> list[int]:
    """A task's prompt ids: its raw prompt when it has one (`/v1/completions`: text tokenized as the
    tokenizer does by default, special tokens such as BOS included; ids as they are), else its
    messages and tools through the chat template. The API sizes prompts with this too, so both agree."""
    if isinstance(raw_prompt, str):
        return [int(i) for i in tokenizer.encode(raw_prompt)]
    if raw_prompt is not None:
        return list(raw_prompt)
    return encode_chat(tokenizer, [template_message(m) for m in messages], template_tools(tools), enable_thinking)
