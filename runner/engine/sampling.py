"""Per-request samplers. A seeded request draws from its own PRNG key, split once per token, so its
tokens depend on its seed and its logits alone: never on what else shares the batch (or the process's
global random state, which batch-mates would advance)."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_p, make_sampler

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
