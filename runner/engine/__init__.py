"""The per-rank engine: every decision that shapes the collective sequence, and the compute.

No I/O here (a house-rules test holds it): the shells plug cancel sources, sinks and phase
trackers in through `protocols`. Entry points: `batch.ContinuousBatch` (every served task),
`engine.Engine` (one rank's model and settings; `generate` runs `shoal generate`'s tasks and the
warm-up), `requests.GenerationRequest` / `GenerationOutcome`.
"""
