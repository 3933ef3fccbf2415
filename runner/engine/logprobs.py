"""Log probabilities of generated tokens, on the sampling rank, from the logits that chose them.

Computed only when a request asks (a top-k over the vocabulary per token is not free), lazily
beside the sampled token so they are evaluated with it, and never part of a collective: the
other ranks do not know they exist (docs/ARCHITECTURE.md §6).
"""

from __future__ import annotations

import math
from typing import cast

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from events.logprobs import TokenLogprob, TopLogprob

LazyLogprobs = tuple[mx.array, mx.array, mx.array]  # (chosen token's logprob, top ids, top logprobs), unevaluated


def token_logprobs(logprobs: mx.array, sampled: mx.array, top: int) -> LazyLogprobs:
    """The sampled token's logprob and the `top` most likely tokens, most likely first, from the
    normalized [1, vocab] logprobs the sampler saw (the model's distribution, before temperature
    and top_p, as OpenAI reports it)."""
    row = logprobs[0]
    chosen = row[sampled[0]]
    if top == 0:
        empty = mx.zeros((0,), dtype=mx.int32)
        return chosen, empty, empty.astype(row.dtype)
    candidates = mx.argpartition(-row, kth=top - 1)[:top]
    values = row[candidates]
    order = mx.argsort(-values)
    return chosen, candidates[order], values[order]


def as_token_logprob(tokenizer: TokenizerWrapper, token: int, lazy: LazyLogprobs) -> TokenLogprob:
    """The evaluated logprobs of `token`, with each token's text as the tokenizer decodes it alone.
    An alternative at -inf (a token a grammar refused) is none: fewer than asked are listed."""
    chosen, top_ids, top_values = lazy
    ids = cast(list[int], top_ids.tolist())
    values = cast(list[float], top_values.astype(mx.float32).tolist())
    top = [
        TopLogprob(token_id=i, token=tokenizer.decode([i]), logprob=v)
        for i, v in zip(ids, values, strict=True)
        if v > -math.inf
    ]
    return TokenLogprob(token_id=token, token=tokenizer.decode([token]), logprob=cast(float, chosen.item()), top=top)
