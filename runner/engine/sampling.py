"""Per-request samplers. A seeded request draws from its own PRNG key, split once per token, so its
tokens depend on its seed and its logits alone: never on what else shares the batch (or the process's
global random state, which batch-mates would advance). A request's logit adjustments (OpenAI's
penalties and logit_bias) are its own too: counts of its own tokens, kept on its own spec."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import mlx.core as mx
import msgspec
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, greedy_sampler

from events.vocabulary import BIAS_BOUND, MAX_BIASED_TOKENS, PENALTY_BOUND
from runner.errors import RequestError

Sampler = Callable[[mx.array], mx.array]


class Truncation(msgspec.Struct, frozen=True, kw_only=True):
    """Which tokens a request's draw may pick, as mlx-lm's sampler chains them: top-p's nucleus,
    then min-p's floor (a token under `min_p` times the likeliest's probability is out), then the
    `top_k` likeliest. 1.0 / 0.0 / 0: off. A top_k of the vocabulary or more keeps every token."""

    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs


class TemperatureSampler:
    """A draw at `temperature` from the truncated distribution: from the request's own PRNG key,
    split once per token, when seeded; from the process's global state when not."""

    def __init__(self, temperature: float, truncation: Truncation, seed: int | None) -> None:
        self.temperature = temperature
        self.truncation = truncation
        self.key = None if seed is None else mx.random.key(seed)

    def __call__(self, logprobs: mx.array) -> mx.array:
        logits = self.truncation(logprobs) * (1 / self.temperature)
        if self.key is None:
            return mx.random.categorical(logits)
        self.key, draw = mx.random.split(self.key)
        return mx.random.categorical(logits, key=draw)


def request_sampler(temperature: float, truncation: Truncation, seed: int | None) -> Sampler:
    """Greedy at temperature 0 (a seed or a truncation changes nothing: the likeliest token is
    always kept); otherwise a draw from the truncated distribution."""
    if temperature == 0:
        return greedy_sampler
    return TemperatureSampler(temperature, truncation, seed)


def check_truncation(truncation: Truncation) -> None:
    """The ranges the API checks already, checked again where the logits are (same verdict on
    every rank): a request that reaches a runner some other way fails alone, never a batch."""
    if not (math.isfinite(truncation.top_p) and 0 < truncation.top_p <= 1):
        raise RequestError(f"top_p must be in (0, 1], got {truncation.top_p}")
    if not (math.isfinite(truncation.min_p) and 0 <= truncation.min_p <= 1):
        raise RequestError(f"min_p must be between 0 and 1, got {truncation.min_p}")
    if truncation.top_k < 0:
        raise RequestError(f"top_k must be 0 (off) or more, got {truncation.top_k}")


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
        self._bias: mx.array | None = None  # [vocab], built on the first logits (their width is the vocabulary)
        self._counts: mx.array | None = None  # [vocab] float32: how often each token was sampled

    @property
    def penalizes(self) -> bool:
        return self.frequency_penalty != 0 or self.presence_penalty != 0

    def apply(self, logits: mx.array) -> mx.array:
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

    def advance(self, sampled: mx.array) -> None:
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
