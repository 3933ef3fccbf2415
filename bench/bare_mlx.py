"""Bare mlx-lm, no shoal: `stream_generate` on one process, the reference for `shoal bench e2e`.

Run as `python -m bench.bare_mlx MODEL_DIR PROMPT MAX_TOKENS RUNS PREFILL_STEP` by the bench, in a
subprocess with the same BLAS environment as a 1-rank runner, and prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import stream_generate

    from runner.models.chat import encode_chat

    model_dir, prompt, max_tokens, runs, step = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    model, tokenizer = load(model_dir)[:2]
    tokens = encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    ttfts: list[float] = []
    decode_rates: list[float] = []
    counts: list[int] = []
    for run in range(runs + 2):  # two warm-up runs first
        started = time.perf_counter()
        first = last = started
        count = 0
        for _response in stream_generate(
            model, tokenizer, mx.array(tokens), max_tokens=max_tokens, prefill_step_size=step
        ):
            last = time.perf_counter()
            if count == 0:
                first = last
            count += 1
        if run >= 2:
            ttfts.append((first - started) * 1000)
            decode_rates.append((count - 1) / (last - first) if count > 1 and last > first else 0.0)
            counts.append(count)
    print(json.dumps({"ttft_ms": ttfts, "decode_tps": decode_rates, "tokens": counts, "prompt_tokens": len(tokens)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
