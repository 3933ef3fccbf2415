"""Per-request samplers. A seeded request draws from its own PRNG key, split once per token, so its
tokens depend on its seed and its logits alone: never on what else shares the batch (or the process's
global random state, which batch-mates would advance). A request's logit adjustments (OpenAI's
penalties and logit_bias) are its own too: counts of its own tokens, kept on its own spec."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, make_sampler

from events.vocabulary import BIAS_BOUND, MAX_BIASED_TOKENS, PENALTY_BOUND
from runner.errors import RequestError

Sampler = Callable[[mx.array], mx.array]


class SeededSampler:
    """mlx-lm's temperature + top-p sampling, with the request's own key instead of the global one."""

    def __init__(self, temperature: float, top_p: float, seed: int) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.key = mx.random.key(seed)

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.key, draw = mx.random.split(self.key)
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        return mx.random.categorical(logprobs * (1 / self.temperature), key=draw)


def request_sampler(temperature: float, top_p: float, seed: int | None) -> Sampler:
    """Greedy at temperature 0 (a seed changes nothing); unseeded draws use the global state."""
    if seed is None or temperature == 0:
        return make_sampler(temp=temperature, top_p=top_p)
    return SeededSampler(temperature, top_p, seed)


class LogitAdjustments:
    """OpenAI's adjustments of one request's logits, before sampling: `logit_bias` added to the
    tokens it names, and for every token the request has generated so far, `frequency_penalty`
    times its count plus `presence_penalty` (once) subtracted (the prompt's tokens are not counted,
    as OpenAI's formula says). The counts are an array advanced with each sampled token (`advance`,
    lazily: a look-ahead step sees the token before it is read back)."""

    def __init__(
        self, frequency_penalty: float, presence_penalty: float, logit_bias: Sequence[tuple[int, float]]
    ) -> None:
        self.frequency_penalty = frequency_penalty
        self.presence_penalty = presence_penalty
        self._bias_pairs = list(logit_bias)
        self._bias: Any = None  # [vocab], built on the first logits (their width is the vocabulary)
        self._counts: Any = None  # [vocab] float32: how often each token was sampled

    @property
    def penalizes(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0

    def apply(self, logits: Any) -> Any:
        """`logits` ([1, vocab]) adjusted."""
        vocab = logits.shape[-1]
        if self._bias_pairs and self._bias is None:
            pairs = [(t, b) for t, b in self._bias_pairs if 0 <= t < vocab]  # all of them once validated
            ids = mx.array([token for token, _ in pairs], dtype=mx.int32)
            values = mx.array([bias for _, bias in pairs], dtype=mx.float32)
            self._bias = mx.zeros((vocab,), dtype=mx.float32).at[ids].add(values)
        if self.penalizes and self._counts is None:
            self._counts = mx.zeros((vocab,), dtype=mx.float32)
        if self._bias is not None:
            logits = logits + self._bias.astype(logits.dtype)
        if self._counts is not None:
            seen = (self._counts > 0).astype(mx.float32)
            penalty = self.frequency_penalty * self._counts + self.presence_penalty * seen
            logits = logits - penalty.astype(logits.dtype)
        return logits

    def advance(self, sampled: Any) -> None:
        """Count the token just sampled (a lazy [1] array)."""
        if self._counts is not None:
            self._counts = self._counts.at[sampled.reshape(-1)].add(1.0)


def logit_adjustments(
    frequency_penalty: float, presence_penalty: float, logit_bias: Sequence[tuple[int, float]]
) -> LogitAdjustments | None:
    """A request's adjustments; None when it asks for none (its sampling is mlx-lm's, untouched)."""
    if not (frequency_penalty or presence_penalty or logit_bias):
        return None
    return LogitAdjustments(frequency_penalty, presence_penalty, logit_bias)


def check_adjustments(
    frequency_penalty: float, presence_penalty: float, logit_bias: Sequence[tuple[int, float]], vocab_size: int | None
) -> None:
    """The ranges the API checks already, checked again where the logits are (same verdict on every
    rank): a request that reaches a runner some other way fails alone, never a batch."""
    for name, value in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        if not (math.isfinite(value) and -PENALTY_BOUND <= value <= PENALTY_BOUND):
            raise RequestError(f"{name} must be between -{PENALTY_BOUND:g} and {PENALTY_BOUND:g}, got {value}")
    if len(logit_bias) > MAX_BIASED_TOKENS:
        raise RequestError(f"logit_bias names {len(logit_bias)} tokens, over the limit of {MAX_BIASED_TOKENS}")
    for token, bias in logit_bias:
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            size = f" of {vocab_size}" if vocab_size is not None else ""
            raise RequestError(f"logit_bias names token {token}, outside the model's vocabulary{size}")
        if not (math.isfinite(bias) and -BIAS_BOUND <= bias <= BIAS_BOUND):
            raise RequestError(
                f"logit_bias for token {token} must be between -{BIAS_BOUND:g} and {BIAS_BOUND:g}, got {bias}"
            )
