"""The few errors the runner raises on purpose, each named by what the user got wrong.

They carry one-line messages meant for a terminal: `shoal generate` prints `str(err)` and exits.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error the runner raises deliberately."""


class ModelDirError(RunnerError):
    """The model directory is missing, is not an mlx-lm model, or has no `layers` list."""


class SplitError(RunnerError):
    """A layer split is not contiguous, has an empty range, or does not cover the model."""


class RequestError(RunnerError):
    """A generation request cannot run: empty prompt, max_tokens <= 0, prompt over the context."""


class RingMismatch(RunnerError):
    """The ring group joined a rank of another instance: its ports were taken by another cluster's
    ranks on the same host, whose connections mlx's ring backend accepts without asking who calls."""


class RankFailedError(RunnerError):
    """A rank of a local group died, stalled past the deadline, or reported an error."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank
