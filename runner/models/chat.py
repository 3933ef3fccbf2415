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
