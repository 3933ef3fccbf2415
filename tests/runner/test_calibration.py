"""The measured exchange rate between a prompt token's matmuls and an attended key (`calibration.py`,
pure): the fit recovers the rate of any machine's cost line, noise never yields a rate, and the
ranks' agreement gives every rank the same one, or the priced one when any rank could not measure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.engine.calibration import (
    MEASURE_ATTEMPTS,
    PLAUSIBLE_FACTOR,
    REPEATS,
    Timing,
    agreed_keys,
    fit_keys_per_token,
    measure_keys_per_token,
    probes,
    proposal,
    time_probes,
)
from runner.engine.plan import balanced_chunk_sizes, chunk_cost

pytestmark = pytest.mark.timeout(30)


def timed(step: int, per_token: float, per_key: float, fixed: float) -> list[Timing]:
    """The probes' times on a machine whose forward costs `fixed` plus its tokens and keys."""
    return [
        Timing(size, offset, fixed + per_token * size + per_key * chunk_cost(size, offset, 0.0))
        for size, offset in probes(step)
    ]


@given(
    step=st.integers(1, 4096),
    per_token=st.floats(1e-5, 1e-1),
    keys=st.floats(10.0, 20_000.0),
    fixed=st.floats(0.0, 0.05),
)
def test_the_fit_recovers_the_rate_of_any_cost_line_whatever_a_forward_costs_fixed(
    step: int, per_token: float, keys: float, fixed: float
) -> None:
    assert fit_keys_per_token(*timed(step, per_token, per_token / keys, fixed)) == pytest.approx(keys, rel=1e-6)


def test_chunks_cut_at_the_fitted_rate_cost_the_same_on_that_machine() -> None:
    """What the rate is for: on a machine where a key costs more than its flops say, the chunks cut
    at the measured rate all cost what the first does, where those cut at the priced one grow."""
    per_token, true_keys, priced, step = 1e-3, 470.0, 614.0, 256
    keys = fit_keys_per_token(*timed(step, per_token, per_token / true_keys, 0.008))
    assert keys is not None

    def seconds(sizes: list[int]) -> list[float]:
        offsets = [sum(sizes[:k]) for k in range(len(sizes))]
        return [
            per_token * s + per_token / true_keys * chunk_cost(s, o, 0.0) for s, o in zip(sizes, offsets, strict=True)
        ]

    measured, first = seconds(balanced_chunk_sizes(2000, step, 0, keys)), seconds([step])[0]
    assert max(measured) <= first * 1.0001
    assert max(seconds(balanced_chunk_sizes(2000, step, 0, priced))) > first * 1.15


def test_noise_larger_than_the_signal_yields_no_rate() -> None:
    full, small, late = timed(256, 1e-3, 2e-6, 0.01)
    assert fit_keys_per_token(full, small, Timing(late.size, late.offset, small.seconds)) is None  # keys free
    assert fit_keys_per_token(Timing(full.size, 0, small.seconds), small, late) is None  # tokens free


def test_probes_that_do_not_isolate_a_key_or_a_token_are_refused() -> None:
    full, small, late = timed(256, 1e-3, 2e-6, 0.01)
    with pytest.raises(ValueError, match="later"):
        fit_keys_per_token(full, small, Timing(late.size, 0, late.seconds))
    with pytest.raises(ValueError, match="larger"):
        fit_keys_per_token(small, small, late)


def test_every_rank_takes_the_mean_when_all_measured_else_the_priced_rate() -> None:
    priced = 614.0
    mine = [proposal(470.4, priced), proposal(489.6, priced)]
    total = [sum(parts) for parts in zip(*mine, strict=True)]
    assert agreed_keys(total, 2, priced) == (470 + 490) / 2
    lost = [proposal(470.4, priced), proposal(None, priced)]  # a rank whose layers could not be timed
    assert agreed_keys([sum(parts) for parts in zip(*lost, strict=True)], 2, priced) == priced
    assert proposal(priced * PLAUSIBLE_FACTOR * 1.01, priced) == [0, 0]  # implausible: taken for noise
    assert proposal(priced / PLAUSIBLE_FACTOR / 1.01, priced) == [0, 0]
    assert proposal(480.0, None) == [0, 0] and agreed_keys([0, 0], 1, None) is None  # a shape not priced


def test_a_round_of_noise_is_timed_again_and_only_plausible_rates_are_kept() -> None:
    """A busy machine's round of probes (keys free, or a rate far off) is timed again; a rank that
    sees only noise in every round measures nothing."""
    line = timed(256, 1e-4, 1e-4 / 500.0, 0.002)
    noise = [line[0], line[1], Timing(line[2].size, line[2].offset, line[1].seconds)]  # keys free
    far = timed(256, 1e-4, 1e-4 / (614.0 * PLAUSIBLE_FACTOR * 2), 0.002)  # a rate 16x the priced one
    rounds = iter([noise, far, line])
    assert measure_keys_per_token(lambda: next(rounds), 614.0) == pytest.approx(500.0)
    tries: list[int] = []

    def always_noise() -> list[Timing]:
        tries.append(1)
        return noise

    assert measure_keys_per_token(always_noise, 614.0) is None and len(tries) == MEASURE_ATTEMPTS


def test_each_probe_is_timed_after_a_warm_up_and_the_fastest_try_kept() -> None:
    prepared: list[tuple[int, int]] = []

    def forward(size: int, offset: int) -> object:
        prepared.append((size, offset))
        return lambda: None

    timings = time_probes(forward, 256)  # pyright: ignore[reportArgumentType]
    assert [(t.size, t.offset) for t in timings] == probes(256)
    assert prepared == [probes(256)[1], *(p for p in probes(256) for _ in range(REPEATS))]
    assert all(t.seconds >= 0 for t in timings)


def test_the_probes_are_large_enough_to_see_a_key_and_bounded_for_a_large_step() -> None:
    assert probes(256) == [(256, 0), (64, 0), (64, 1024)]
    assert probes(32) == [(128, 0), (32, 0), (32, 1024)]  # a small step: its keys would hide in the noise
    assert probes(2048)[2] == (512, 2048)  # not 8,192 positions of KV
    assert probes(4096)[2] == (1024, 4096)  # at least a step past the first
