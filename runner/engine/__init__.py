"""The per-rank engine: every decision that shapes the collective sequence, and the compute.

No I/O here (a house-rules test holds it): the shells plug cancel sources, sinks and phase
trackers in through `protocols`. Entry points: `engine.Engine` (`agree_start`, `generate`,
`warm_up`), `engine.GenerationRequest` / `GenerationOutcome`.
"""
