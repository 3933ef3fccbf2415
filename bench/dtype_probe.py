"""Which dtype MLX's CPU backend decodes fastest here: a decode step of a slice of `serve`'s
`qwen3-0.6b` shape (its layer, fewer of them) in each dtype, alternating in rounds in one process.

Run it as a runner runs (its OpenBLAS preloaded, its threads pinned), so the figure is the one a
served model would see:

    uv run python -m bench.dtype_probe [--dtypes float32,q4,q8,bfloat16] [--layers 4] [--rounds 3]

with the runner's environment (`runner.blas.blas_env`, `runner.affinity.compute_cpu_env`) set;
it prints one JSON line per dtype, batch and round (`step_ms`: one decode step of `batch` rows).
The choice and its measurement are stated beside the shape (`bench/serve_sides.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from runner.affinity import pin_compute_threads

QUANTIZED_BITS = {"q4": 4, "q8": 8}


def main(argv: list[str]) -> int:
    pin_compute_threads(os.environ)  # first, as a runner does
    parser = argparse.ArgumentParser(prog="bench.dtype_probe")
    parser.add_argument("--dtypes", default="float32,q4,q8,bfloat16")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", default="1,16")
    args = parser.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    models = {dtype: _model(dtype, args.layers) for dtype in dtypes}
    for index in range(args.rounds):
        for dtype in dtypes[index % len(dtypes) :] + dtypes[: index % len(dtypes)]:
            for batch in batches:
                step = _step_seconds(models[dtype], batch)
                print(json.dumps({"round": index, "dtype": dtype, "batch": batch, "step_ms": round(step * 1000, 1)}))
                sys.stdout.flush()
    return 0


def _model(dtype: str, layers: int) -> Any:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import _get_classes  # pyright: ignore[reportPrivateUsage]  # the family lookup load_model uses

    from bench.serve_sides import QWEN3_06B

    config = {**QWEN3_06B, "num_hidden_layers": layers}
    model_class, args_class = _get_classes(config)
    mx.random.seed(1)
    model = model_class(args_class.from_dict(config))
    if dtype in QUANTIZED_BITS:
        nn.quantize(model, group_size=64, bits=QUANTIZED_BITS[dtype])
    elif dtype != "float32":
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


def _step_seconds(model: Any, batch: int, context: int = 16, steps: int = 4) -> float:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((batch, context), dtype=mx.int32), cache=cache))
    token = mx.zeros((batch, 1), dtype=mx.int32)
    mx.eval(model(token, cache=cache))
    started = time.perf_counter()
    for _ in range(steps):
        mx.eval(model(token, cache=cache))
    return (time.perf_counter() - started) / steps


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
