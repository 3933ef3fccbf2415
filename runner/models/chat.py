"""Chat messages -> prompt token ids with the tokenizer's own chat template (no MLX)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Apply the chat template (with the assistant generation prompt) and tokenize.

    Works with an mlx-lm TokenizerWrapper or a transformers tokenizer. A tokenizer without a
    chat template gets the messages' contents joined by newlines.
    """
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # some transformers versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer.encode("\n".join(m["content"] for m in plain))]


def encode_task_prompt(
    tokenizer: Any, messages: Sequence[Mapping[str, str]], raw_prompt: str | list[int] | None
) -> list[int]:
    """A task's prompt ids: its raw prompt when it has one (`/v1/completions`: text tokenized as the
    tokenizer does by default, special tokens such as BOS included; ids as they are), else its
    messages through the chat template. The API sizes prompts with this too, so both agree."""
    if isinstance(raw_prompt, str):
        return [int(i) for i in tokenizer.encode(raw_prompt)]
    if raw_prompt is not None:
        return list(raw_prompt)
    return encode_chat(tokenizer, messages)
