"""A sized option: the flag if given, else its --quick size or its full size."""

from __future__ import annotations

import argparse

from bench.options import Sized, add_sized, resolve

OPTIONS = (Sized("--rounds", 20, 3, "rounds"), Sized("--recorder-seconds", 1.5, 0.2, "seconds", float))


def _parse(*argv: str) -> dict[str, object]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    add_sized(parser, OPTIONS)
    return resolve(parser.parse_args(list(argv)), OPTIONS)


def test_full_quick_and_explicit_sizes() -> None:
    assert _parse() == {"rounds": 20, "recorder_seconds": 1.5}
    assert _parse("--quick") == {"rounds": 3, "recorder_seconds": 0.2}
    assert _parse("--quick", "--rounds", "20") == {"rounds": 20, "recorder_seconds": 0.2}
    assert _parse("--recorder-seconds", "0.5", "--quick") == {"rounds": 3, "recorder_seconds": 0.5}


def test_help_states_both_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_sized(parser, OPTIONS)
    assert "(default 20; 3 with --quick)" in parser.format_help()
