"""`shoal model make-tiny`: write the deterministic random-weight test model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    model = subparsers.add_parser("model", help="model utilities")
    actions = model.add_subparsers(dest="model_action", metavar="ACTION", required=True)
    tiny = actions.add_parser("make-tiny", help="write a tiny random-weight mlx-lm model (no download)")
    tiny.add_argument("--out", required=True, type=Path, help="directory to write the model into")
    tiny.add_argument("--layers", type=int, default=8)
    tiny.add_argument("--hidden", type=int, default=256)
    tiny.add_argument("--vocab", type=int, default=1024)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument(
        "--family",
        choices=["qwen3", "qwen3-thinking", "llama3", "mistral"],
        help="a model family's special tokens and chat template (runner/models/tiny_families.py); default: the tiny model's own",
    )
    tiny.set_defaults(handler=make_tiny_command)


def make_tiny_command(args: argparse.Namespace) -> int:
    from runner.models.tiny import TinySpec, make_tiny  # lazy: pulls in MLX

    if args.layers < 1 or args.hidden < 64 or args.hidden % 64 or args.vocab < 259:
        print("shoal model make-tiny: need --layers >= 1, --hidden a multiple of 64, --vocab >= 259")
        return 2
    spec = TinySpec(layers=args.layers, hidden=args.hidden, vocab=args.vocab, seed=args.seed)
    if args.family is not None:
        from runner.models.tiny_families import make_tiny_family

        print(make_tiny_family(args.out, args.family, spec))
        return 0
    print(make_tiny(args.out, spec))
    return 0
