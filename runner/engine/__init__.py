"""The per-rank engine: every decision that shapes the collective sequence, and the compute.

No I/O here (a house-rules test holds it): the shells plug cancel sources, sinks and phase
trackers in through `protocols`. Entry points: `engine.Engine` (one rank's model, settings and
checks), `batch.ContinuousBatch` (the one execution path: every request runs through its `step`),
`alone.serve_alone` (a request alone as a batch of one: `shoal generate`, the warm-up, the
benches' engine alone), `requests.GenerationRequest` / `GenerationOutcome`.
"""
