"""Log probabilities of generated tokens: value types the sampling rank's engine produces and
`ChunkGenerated` carries, here (pure, no I/O) so the engine can build them without the catalogue."""

from __future__ import annotations

import msgspec


class TopLogprob(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    token_id: int
    token: str  # the token decoded on its own
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One generated token's log probability under the model, from the logits that chose it, and
    the most likely alternatives there (most likely first)."""

    token_id: int
    token: str
    logprob: float
    top: list[TopLogprob] = msgspec.field(default_factory=list)
