"""Forming an instance's ring (`mx.distributed.init`, backend ring), with the one retry that is safe.

mlx's ring forms in a fixed order: the last rank connects to rank 0 first, and every other rank
first accepts its left neighbour. A connect tries five times over about 15 s (mlx's
`CONN_ATTEMPTS`, waiting 1, 2, 4 and 8 s), so a rank 0 that is still starting after that
(importing MLX on a loaded host takes tens of seconds) fails the last rank with
"[ring] Couldn't connect (error: 111)", and its whole instance with it. At that point the last rank
has done nothing else: no connection accepted, no peer waiting on it, and mlx keeps no group from
a failed init, so it may try again. Any other rank's connect comes after it accepted its left
neighbour, which then moved on: for it a retry would wait for ever, so it fails as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loguru import logger

if TYPE_CHECKING:
    import mlx.core as mx

LAST_RANK_CONNECT_TRIES = 4  # each about 15 s of mlx's own attempts: a minute for rank 0 to start


def init_ring(rank: int, world: int) -> mx.distributed.Group:
    """This rank's ring group (`MLX_RANK` and `MLX_HOSTFILE` set), the last rank retrying a
    connect to rank 0 that found nobody listening yet."""
    import mlx.core as mx

    tries = LAST_RANK_CONNECT_TRIES if rank == world - 1 else 1
    for attempt in range(1, tries):
        try:
            return mx.distributed.init(backend="ring", strict=True)
        except RuntimeError as exc:
            if "Couldn't connect" not in str(exc):
                raise
            logger.warning(
                "rank {}: rank 0 is not listening yet ({}); connecting again ({}/{})", rank, exc, attempt, tries
            )
    return mx.distributed.init(backend="ring", strict=True)
