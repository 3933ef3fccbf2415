"""Constrained decoding on the sampling rank: a grammar masks the logits before sampling.

Only the last rank holds a `TokenMask`; the others never see it. The mask changes which token the
sampler picks, not which collectives run: the token is agreed and broadcast as always, and the
grammar advances on the sampling rank after the agreement. Once the grammar is complete it
allows only end-of-sequence, so the output ends with the same EOS rule every rank applies
(finish_reason "stop"); a task cut by max_tokens first ends "length", its output unfinished.
"""

from __future__ import annotations

from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import mlx.core as mx
import numpy as np


class TokenMask:
    """One task's grammar state: `apply` before sampling, `advance` with the agreed token."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str, vocab_size: int) -> None:
        # Never raises: every rank checked the grammar before the task (`Engine.validate`), and a
        # matcher that still errs masks all but EOS, so the task ends on every rank by the EOS rule
        # rather than by an exception on this rank alone (which would leave the others waiting).
        self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self.vocab_size = vocab_size
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, tokenizer.vocab_size)

    def apply(self, logprobs: mx.array) -> mx.array:
        """`logprobs` (1 x vocab) with every token the grammar refuses at -inf."""
        llguidance.numpy.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        allowed = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")[: self.vocab_size]
        mask = mx.array(allowed.astype(np.bool_))  # pyright: ignore[reportArgumentType]  # mlx takes numpy arrays
        return mx.where(mask, logprobs, mx.array(-mx.inf, dtype=logprobs.dtype))

    def advance(self, token: int) -> None:
        """Take the agreed token. A token the mask refused cannot be agreed; if the matcher errs
        anyway, its next mask allows nothing but EOS (llguidance's error state), ending the task."""
        self.matcher.consume_token(token)


class GrammarCompiler:
    """The tokenizer as llguidance needs it, built once per engine (about a second for big vocabs)."""

    def __init__(self, hf_tokenizer: Any, eos_id: int, vocab_size: int) -> None:
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos_id)
        self.vocab_size = vocab_size

    def mask(self, grammar: str) -> TokenMask:
        return TokenMask(self.tokenizer, grammar, self.vocab_size)
