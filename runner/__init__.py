"""The MLX engine: load a shard, pipeline/sequential prefill, decode, cancel agreement.

MLX is imported only under this package (DESIGN.md §2). Modules the CLI imports at start-up
(`launch`, `blas`, `plan`, `model_info`, `local_run`, `protocols`, `errors`, `chat`) do not
import MLX at module level; `engine`, `shard`, `prefill`, `decode`, `sends` do.

Entry points for the services: `shard.load_shard`, `engine.Engine` (`agree_start`, `generate`,
`warm_up`), `engine.GenerationRequest` / `GenerationOutcome`, `chat.encode_chat`, and the
seams in `protocols` (`CancelSource`, `RunnerSink`, `PhaseTracker`).
"""
