"""What a decode step costs against a prompt chunk, on one rank's clock (pure: no MLX).

A newcomer's prompt chunks ride the running rows' steps (`batch.py`), so a step that carries one
takes the chunk's time plus the rows' decode: a running stream's gap grows by more than one chunk.
Sarathi-Serve's answer is a budget per step that the decode spends first; here the chunk gives up
what the rows' decode costs (`plan.balanced_chunk_sizes`, `room`), so the step that carries it
takes about one chunk's time. That cost is the machine's, not the model's: on a CPU a small
decode step is mostly per-operation overhead, which no flop count sees, so it is measured.

Only rank 0's measure counts, and it reaches every rank through a step's all-reduce
(`batch_plan.StepLayout`, the pace slot, as a share in thousandths): a newcomer's chunks are fixed
at its admission from that agreed share, the same on every rank (docs/ARCHITECTURE.md §6). Each
rank still keeps its own `StepPace`; the others' are never read.
"""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.2  # weight of the newest period in the running averages
# A decode step never takes more than this share of a chunk: past it a newcomer's prompt would take
# many more steps than the rows' gaps gain (and a mis-measured step cannot starve a prompt).
MAX_DECODE_SHARE = 0.5
SHARE_SCALE = 1000  # the agreed share is an integer in thousandths
# Only chunks of at least this share of a full chunk's cost teach the time per unit of cost: a short
# prompt's chunk is mostly a forward's fixed overhead, which would make every chunk look dearer.
SMALLEST_MEASURED_CHUNK = 0.5


@dataclass(slots=True)
class StepPace:
    """Running averages of this rank's step periods: a step of decode rows alone, and the time one
    unit of chunk cost (`plan.prefill_cost`) adds to a step. `chunk_cost`: a full first chunk's."""

    chunk_cost: float
    decode_s: float | None = None  # a step's period with rows and no chunk
    per_cost_s: float | None = None  # seconds per unit of chunk cost

    def observe(self, period_s: float, rows: int, chunk_cost: float) -> None:
        """One step's period (from the previous step's agreement to this one's), with the rows this
        rank decoded and the cost of the chunks it computed in it."""
        if period_s <= 0:
            return
        if chunk_cost <= 0:
            if rows:
                self.decode_s = _average(self.decode_s, period_s)
            return
        if chunk_cost < SMALLEST_MEASURED_CHUNK * self.chunk_cost or (rows and self.decode_s is None):
            return  # mostly overhead, or the chunk's part of this step cannot be told from the rows' yet
        decode = (self.decode_s or 0.0) if rows else 0.0
        self.per_cost_s = _average(self.per_cost_s, max(0.0, period_s - decode) / chunk_cost)

    def decode_share(self) -> int:
        """A decode step's time over a full chunk's, in thousandths, at most `MAX_DECODE_SHARE`; 0
        while either is unknown."""
        if self.decode_s is None or not self.per_cost_s or self.chunk_cost <= 0:
            return 0
        share = self.decode_s / (self.per_cost_s * self.chunk_cost)
        return round(min(MAX_DECODE_SHARE, share) * SHARE_SCALE)


def chunk_room(share: int) -> float:
    """What is left of a chunk's budget for a newcomer's chunk beside a decode step of `share`
    thousandths (an agreed value: the same on every rank)."""
    return 1.0 - min(MAX_DECODE_SHARE, max(0, share) / SHARE_SCALE)


def _average(current: float | None, value: float) -> float:
    return value if current is None else (1 - SMOOTHING) * current + SMOOTHING * value
