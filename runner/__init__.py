"""The MLX engine and its two process shells. MLX is imported only under this package.

Rooms (docs/ARCHITECTURE.md §1):
- `engine/`: the per-rank engine — the continuous batch every request runs through (a request
  alone: a batch of one), plan, prefill, decode, sends, collectives, stop rules and the seams
  (`protocols`). Compute only: no sockets, files, threads or subprocesses.
- `models/`: load and shard an mlx-lm model, model facts readable without MLX, the tiny model
  and tokenizer, chat templates.
- `local/`: the local ring launcher behind `shoal generate` and its rank process; `local.testing`
  is the test tooling a rank runs for test jobs (test-only: excluded from the wheel; the tests
  spawn real rank processes from a checkout, which import it from there).
- `service/`: the long-lived runner process a worker spawns per rank, plugged into the log.
- `flight/`: what both shells share to observe and test a rank: the flight recorder (one thread;
  the service publishes heartbeats, a local rank writes a phase file) and the test-only fault
  injector.
- `blas.py` (which BLAS a rank process preloads) and `errors.py` (the named errors) serve all.

Modules the CLI imports at start-up (`local.launch`, `blas`, `engine.plan`, `models.model_info`,
`local.local_run`, `engine.protocols`, `errors`, `models.chat`) do not import MLX at module level.
"""
