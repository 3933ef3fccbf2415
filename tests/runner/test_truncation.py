"""A request's truncations of the draw (`top_p`, `min_p`, `top_k`): which tokens each keeps, on
a few logprobs; that a draw never leaves them; and that the runner refuses values out of range,
on every rank alike. (A truncated seeded stream in a batch equals itself alone on 1-3 ranks:
`test_group_batch`'s stops schedule.)"""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import greedy_sampler

from runner.engine.sampling import TemperatureSampler, Truncation, check_truncation, request_sampler
from runner.errors import RequestError

pytestmark = pytest.mark.timeout(120)

# probabilities 0.4, 0.3, 0.15, 0.1, 0.05
PROBS = [0.4, 0.3, 0.15, 0.1, 0.05]
LOGPROBS = mx.log(mx.array([PROBS]))


def kept(truncation: Truncation) -> list[int]:
    row = truncation(LOGPROBS)[0].tolist()
    return [token for token, value in enumerate(row) if value != -math.inf]


@pytest.mark.parametrize(
    ("truncation", "tokens"),
    [
        (Truncation(), [0, 1, 2, 3, 4]),
        (Truncation(top_k=2), [0, 1]),
        (Truncation(top_k=1), [0]),
        (Truncation(top_k=5), [0, 1, 2, 3, 4]),  # the whole vocabulary: nothing to drop
        (Truncation(top_k=10**9), [0, 1, 2, 3, 4]),
        (Truncation(min_p=0.5), [0, 1]),  # p >= 0.5 x 0.4
        (Truncation(min_p=0.3), [0, 1, 2]),
        (Truncation(min_p=1.0), [0]),
        (Truncation(top_p=0.7), [0, 1]),
        (Truncation(top_p=0.9, min_p=0.3), [0, 1, 2]),  # nucleus [0, 1, 2, 3], then the floor
        (Truncation(top_p=0.9, top_k=2), [0, 1]),
        (Truncation(min_p=0.2, top_k=3), [0, 1, 2]),  # floor [0, 1, 2, 3], then the top 3
    ],
)
def test_which_tokens_each_truncation_keeps(truncation: Truncation, tokens: list[int]) -> None:
    assert kept(truncation) == tokens


def test_a_hot_draw_never_leaves_the_kept_tokens() -> None:
    """At temperature 2 an untruncated draw reaches the tail; truncated, it never does."""
    logprobs = mx.log(mx.softmax(mx.random.normal((1, 64), key=mx.random.key(3)), axis=-1))
    order = mx.argsort(-logprobs[0]).tolist()
    free = TemperatureSampler(2.0, Truncation(), seed=1)
    top3 = TemperatureSampler(2.0, Truncation(top_k=3), seed=1)
    free_draws = {int(free(logprobs).item()) for _ in range(200)}
    top3_draws = {int(top3(logprobs).item()) for _ in range(200)}
    assert top3_draws <= set(order[:3]) and len(top3_draws) > 1
    assert not free_draws <= set(order[:3])  # the same draws, untruncated, do leave them


def test_a_seed_gives_the_same_draws_and_temperature_zero_is_greedy() -> None:
    logprobs = mx.log(mx.softmax(mx.random.normal((1, 64), key=mx.random.key(5)), axis=-1))

    def draws(seed: int) -> list[int]:
        sampler = request_sampler(1.0, Truncation(min_p=0.05, top_k=20), seed)
        return [int(sampler(logprobs).item()) for _ in range(30)]

    assert draws(7) == draws(7) != draws(8)
    assert request_sampler(0.0, Truncation(top_k=3), 7) is greedy_sampler


@pytest.mark.parametrize(
    ("truncation", "says"),
    [
        (Truncation(top_k=-1), "top_k must be 0 (off) or more"),
        (Truncation(min_p=1.5), "min_p must be between 0 and 1"),
        (Truncation(min_p=math.nan), "min_p must be between 0 and 1"),
        (Truncation(top_p=0.0), "top_p must be in (0, 1]"),
    ],
)
def test_the_runner_refuses_a_truncation_out_of_range(truncation: Truncation, says: str) -> None:
    with pytest.raises(RequestError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_truncation(truncation)
    check_truncation(Truncation(top_p=1.0, min_p=1.0, top_k=10**9))  # the ends of the ranges
