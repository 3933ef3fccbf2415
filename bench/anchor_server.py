"""`mlx_lm.server` as `shoal bench serve` starts it: its own `main`, after pinning the process's
threads as a shoal runner pins its own (`runner.affinity.pin_compute_threads`), where the
bench names a CPU in `SHOAL_COMPUTE_CPU`; without it, exactly the console script.

The pin comes first, before mlx loads, so every thread mlx_lm.server starts after it (its HTTP
handlers, its generation thread, MLX's stream threads) inherits the CPU, while OpenBLAS's
workers, started when the library is preloaded (`runner.blas`), keep every CPU: the runner's
layout. mlx_lm.server runs HTTP and generation in one process, so pinned, its handlers share the
compute CPU; the bench therefore runs it both ways and reads shoal against the faster per round.

    python -m bench.anchor_server [mlx_lm.server arguments]
"""

from __future__ import annotations

import os
import sys

from runner.affinity import pin_compute_threads


def main(argv: list[str]) -> int:
    pin_compute_threads(os.environ)
    from mlx_lm.server import main as server_main

    sys.argv = ["mlx_lm.server", *argv]
    server_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
