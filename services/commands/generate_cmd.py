"""`shoal generate`: run one prompt on N local ring ranks and print the text (or JSON)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from events.task_params import TaskParams
from runner.local.local_run import RUNNER_DEFAULTS

DEFAULT_PARAMS = TaskParams()  # a served task's defaults: `shoal generate` samples alike


def register(subparsers: Any) -> None:
    gen = subparsers.add_parser("generate", help="generate on N local ranks (ring backend on 127.0.0.1)")
    gen.add_argument("--model", default="tiny", help="an mlx-lm model directory, or `tiny`")
    gen.add_argument("--ranks", type=int, default=1)
    gen.add_argument("--split", type=_counts, default=None, help="layers per rank, e.g. 4,4")
    prompt = gen.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="user message (the model's chat template is applied)")
    prompt.add_argument("--prompt-tokens", type=int, help="use K synthetic prompt tokens instead")
    gen.add_argument("--max-tokens", type=int, default=DEFAULT_PARAMS.max_tokens)
    gen.add_argument("--temperature", type=float, default=DEFAULT_PARAMS.temperature)
    gen.add_argument("--top-p", type=float, default=DEFAULT_PARAMS.top_p)
    gen.add_argument(
        "--min-p",
        type=float,
        default=DEFAULT_PARAMS.min_p,
        help="drop tokens under MIN_P x the likeliest's probability",
    )
    gen.add_argument(
        "--top-k", type=int, default=DEFAULT_PARAMS.top_k, help="draw from the TOP_K likeliest tokens only (0: all)"
    )
    gen.add_argument("--seed", type=int, default=DEFAULT_PARAMS.seed)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--prefill-step", type=int, default=RUNNER_DEFAULTS.prefill_step_size)
    gen.add_argument("--kv-bits", type=int, default=RUNNER_DEFAULTS.kv_bits, help="KV-cache bits (default: off)")
    gen.add_argument("--cancel-at-iteration", type=int, default=None, help="cancel at this prefill iteration")
    gen.add_argument("--cancel-rank", type=int, default=0, help="the rank that sees the cancel")
    gen.add_argument("--deadline", type=float, default=120.0, help="fail if the group is not done by then (s)")
    gen.add_argument("--no-warmup", action="store_true")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.set_defaults(handler=generate_command)


def _counts(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--split wants layer counts like 4,4, got {text!r}") from None


def generate_command(args: argparse.Namespace) -> int:
    from runner.errors import RunnerError
    from runner.local.launch import run_group
    from runner.local.local_run import LocalRunSpec, build_job, summarize
    from runner.models.resolve import resolve_model

    spec = LocalRunSpec(
        model=args.model,
        ranks=args.ranks,
        split=args.split,
        prompt=args.prompt,
        prompt_tokens=args.prompt_tokens,
        params=TaskParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            min_p=args.min_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=args.stop,
        ),
        prefill_step=args.prefill_step,
        kv_bits=args.kv_bits,
        cancel_at_iteration=args.cancel_at_iteration,
        cancel_rank=args.cancel_rank,
        warmup=not args.no_warmup,
    )
    try:
        job = build_job(spec, resolve_model(args.model))
        summary = summarize(run_group(job, args.ranks, args.deadline))
    except RunnerError as err:
        print(f"shoal generate: error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary))
    else:
        print(summary["text"])
    return 0
