"""The ring's per-chunk protocol costs, measured: one all-reduce, one send/recv of a chunk.

`probe(world, tokens, hidden, dtype, reps)` starts `world` local ring ranks (the same hostfile
and BLAS environment as `shoal generate`'s ranks) running `python -m bench.ring_probe`. Each
repetition, in rotating order, times on rank 0:
- `all_reduce`: the engine's per-iteration agreement, an `all_sum` of two int32;
- `send_recv`: a chunk's activations (1 x tokens x hidden) sent to rank 1 and sent back; half
  the round trip is one hop, what a pipeline stage boundary costs per chunk.
Ranks past 1 join the all-reduces only. Rank 0 writes every sample to `OUT/probe.json`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.rounds import rotated

WARMUP = 10
OPS = ("all_reduce", "send_recv")


def probe(
    world: int, tokens: int, hidden: int, dtype: str, reps: int, timeout_s: float = 120.0
) -> dict[str, list[float]]:
    """op -> per-repetition milliseconds (send_recv: one hop, half the round trip)."""
    from runner.local.launch import free_ports, rank_env, ring_hostfile

    if world < 2:
        raise ValueError("the ring probe needs at least 2 ranks")
    with tempfile.TemporaryDirectory(prefix="shoal-ring-probe-") as tmp:
        out = Path(tmp)
        hostfile = out / "hostfile.json"
        hostfile.write_text(json.dumps(ring_hostfile(free_ports(world))))
        argv = [sys.executable, "-m", "bench.ring_probe", str(out), str(tokens), str(hidden), dtype, str(reps)]
        processes = [
            subprocess.Popen(
                argv,
                env=rank_env(rank, world, hostfile, dict(os.environ)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=(out / f"rank{rank}.err").open("wb"),
            )
            for rank in range(world)
        ]
        try:
            deadline = time.monotonic() + timeout_s
            for rank, process in enumerate(processes):
                code = process.wait(timeout=max(0.1, deadline - time.monotonic()))
                if code != 0:
                    tail = (out / f"rank{rank}.err").read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"ring probe rank {rank} exited with {code}: {tail}")
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        return json.loads((out / "probe.json").read_text())


def main(argv: list[str]) -> int:
    import mlx.core as mx

    from runner.blas import BlasThreads

    out, tokens, hidden, dtype, reps = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3], int(argv[4])
    BlasThreads.at_share(os.environ)  # as a rank of shoal's starts: its share of the node's cores
    group = mx.distributed.init(backend="ring", strict=True)
    rank = group.rank()
    chunk = mx.zeros((1, tokens, hidden), dtype=getattr(mx, dtype))
    votes = mx.array([0, 0], dtype=mx.int32)

    def all_reduce() -> None:
        mx.eval(mx.distributed.all_sum(votes, group=group))

    def send_recv() -> None:
        if rank == 0:
            mx.eval(mx.distributed.send(chunk, 1, group=group))
            mx.eval(mx.distributed.recv_like(chunk, 1, group=group))
        elif rank == 1:
            mx.eval(mx.distributed.recv_like(chunk, 0, group=group))
            mx.eval(mx.distributed.send(chunk, 0, group=group))

    ops = {"all_reduce": all_reduce, "send_recv": send_recv}
    samples: dict[str, list[float]] = {name: [] for name in OPS}
    for index in range(WARMUP + reps):
        for name in rotated(OPS, index):
            started = time.perf_counter()
            ops[name]()
            elapsed_ms = (time.perf_counter() - started) * 1000
            if index >= WARMUP:
                samples[name].append(elapsed_ms / 2 if name == "send_recv" else elapsed_ms)
    if rank == 0:
        (out / "probe.json").write_text(json.dumps(samples))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
