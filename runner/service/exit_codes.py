"""How a runner process ends, as its worker reads it (no MLX here: the worker imports it)."""

from __future__ import annotations

from events.vocabulary import RunnerStatusCause

# The ring group broke because another rank went away (killed, crashed, node gone). This rank is
# a casualty, not the culprit: the worker reports it as such so the master can wait for (and
# name) the rank that actually died.
PEER_LOST_EXIT = 75


def is_peer_loss(exc: BaseException) -> bool:
    """A collective failed because a peer's connection dropped (mlx's ring backend says so)."""
    text = str(exc).lower()
    return "peer" in text and ("[ring]" in text or "connection" in text)


def exit_cause(code: int) -> RunnerStatusCause:
    """Why a runner process that its worker did not stop went away, from its exit status."""
    if code == PEER_LOST_EXIT:
        return "peer_lost"
    return "killed" if code < 0 else "exited"
