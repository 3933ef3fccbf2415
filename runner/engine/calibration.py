"""A prompt token's matmuls against an attended key, measured on this machine's rank (`plan.chunk_cost`).

`balanced_chunk_sizes` cuts a newcomer's prompt into chunks of equal cost so that each step that
carries one takes about one chunk's time beside the running streams. The exchange rate it prices
them at, `plan.keys_per_token`, comes from flops, and a machine does not run at its flop rate alike
for both: small matmuls run far below it on a CPU, and attention's softmax costs more than its
flops. Measured on a 2-core Xeon, the tiny model's rate was about 470 keys per token against 614
priced, and qwen3-100m's 575 against 1,638, so the late chunks of a 2,000-token prompt ran 1.2x and
1.8x as long as its first, and the streams beside it waited that much longer per token.

So each rank times its own layers on synthetic activations, alone (no collective, nothing sent):
a full first chunk, a small chunk, and the same small chunk after a long cached prefix. Those three
give the cost of a token, of an attended key and of a forward; the ranks agree on the mean rate in
one all-reduce (`Engine.calibrate_prefill`), so every rank cuts every prompt alike. A round of
probes whose rate is noise (a difference not positive, a rate implausibly far from the priced one)
is timed again, up to `MEASURE_ATTEMPTS` rounds; a rank that still cannot measure (or whose layers
are called otherwise) proposes nothing, and then every rank keeps the priced rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.engine.plan import chunk_cost

# The full probe is a step of at least PROBE_MIN_STEP tokens, the small one a quarter of it; the
# late one runs after LATE_OFFSET_STEPS full probes of cached prefix, at least LATE_OFFSET_MIN
# positions (below that a key's cost hides in the noise of a few layers' forward) and at most
# LATE_OFFSET_MAX past a step (a large prefill step would hold the KV of tens of thousands of
# positions just to time them).
PROBE_MIN_STEP = 128
SMALL_CHUNK_DIVISOR = 4
LATE_OFFSET_STEPS = 4
LATE_OFFSET_MIN = 1024
LATE_OFFSET_MAX = 2048
REPEATS = 3  # each chunk is timed this many times, the fastest kept: a shared machine's noise only adds
# A rank whose timings gave no plausible rate times them again, up to this many times in all: on a
# busy machine one round of probes can come out noise (milliseconds each, on a small model).
MEASURE_ATTEMPTS = 3
# A measured rate further than this factor from the priced one is taken for noise: the priced one stands.
PLAUSIBLE_FACTOR = 8.0


@dataclass(frozen=True, slots=True)
class Timing:
    """One timed forward of `size` prompt tokens after `offset` cached ones."""

    size: int
    offset: int
    seconds: float


def probes(step: int) -> list[tuple[int, int]]:
    """(size, offset) of the three forwards a rank times: a full chunk, a small one, the small one late."""
    full = max(step, PROBE_MIN_STEP)
    small = full // SMALL_CHUNK_DIVISOR
    late = max(LATE_OFFSET_MIN, min(LATE_OFFSET_STEPS * full, max(full, LATE_OFFSET_MAX)))
    return [(full, 0), (small, 0), (small, late)]


def fit_keys_per_token(full: Timing, small: Timing, late: Timing) -> float | None:
    """Keys per token from the three probes: the late probe's extra time over the small one is the
    keys it attends to beyond it (the cost of a key), and the full chunk's extra time over the small
    one, less its extra keys, is its extra tokens' matmuls (the cost of a token); a forward's fixed
    cost cancels in both. None when a difference is not positive (noise larger than the signal)."""
    if small.offset != full.offset or small.size != late.size or late.offset <= small.offset:
        raise ValueError("probes: the full and small chunks start alike, the late one is the small one later")
    if full.size <= small.size:
        raise ValueError("probes: the full chunk must be larger than the small one")
    per_key = (late.seconds - small.seconds) / (late.size * (late.offset - small.offset))
    if per_key <= 0:
        return None
    extra_keys = chunk_cost(full.size, full.offset, 0.0) - chunk_cost(small.size, small.offset, 0.0)
    per_token = (full.seconds - small.seconds - per_key * extra_keys) / (full.size - small.size)
    if per_token <= 0:
        return None
    return per_token / per_key


def plausible(measured: float | None, priced: float | None) -> bool:
    """A measured rate within PLAUSIBLE_FACTOR of the priced one (none is, for a shape not priced)."""
    return (
        priced is not None
        and measured is not None
        and priced / PLAUSIBLE_FACTOR <= measured <= priced * PLAUSIBLE_FACTOR
    )


def measure_keys_per_token(
    time_once: Callable[[], list[Timing]], priced: float, attempts: int = MEASURE_ATTEMPTS
) -> float | None:
    """The first plausible rate of up to `attempts` rounds of `time_once()` (the probes' timings,
    `time_probes`); None when none was."""
    for _ in range(attempts):
        measured = fit_keys_per_token(*time_once())
        if plausible(measured, priced):
            return measured
    return None


def proposal(measured: float | None, priced: float | None) -> list[int]:
    """This rank's slots of the agreement: [its rate, rounded; 1] when it measured one within
    PLAUSIBLE_FACTOR of the priced rate, else [0, 0]."""
    if measured is None or not plausible(measured, priced):
        return [0, 0]
    return [max(1, round(measured)), 1]


def agreed_keys(total: list[int], world: int, priced: float | None) -> float | None:
    """The mean of the ranks' rates when every rank measured one, else the priced rate (alike on every rank)."""
    rates, measured = total
    return rates / world if measured == world and priced is not None else priced


def time_probes(forward: Callable[[int, int], Callable[[], Any]], step: int) -> list[Timing]:
    """Time each probe `REPEATS` times (after one untimed warm-up forward), keeping the fastest.
    `forward(size, offset)` prepares a forward (its inputs and caches evaluated) and returns the call
    that runs it to completion."""
    forward(*probes(step)[1])()
    timings: list[Timing] = []
    for size, offset in probes(step):
        best = float("inf")
        for _ in range(REPEATS):
            run = forward(size, offset)
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
        timings.append(Timing(size, offset, best))
    return timings
