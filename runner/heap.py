"""A long-running shoal process's heap (a runner, `shoal up`, the API): what it loaded to start is kept
out of the garbage collector's way.

A shoal process holds millions of objects from what it imported and loaded (transformers, the
tokenizers, mlx-lm, jinja), and Python's full (generation 2) collection walks all of them. Measured:
in `shoal up`, 207-239 ms with the event loop stopped, set off by a burst of 500 requests' garbage
(what /healthz answered in at that moment; tests/e2e/test_burst.py asks for p99 < 100 ms: after,
33-63 ms); in a runner, 106 ms mid-decode, every stream of its batch stalled (after: none while
serving 32 streams). `settle_heap`, once a process is ready, collects once and freezes what is
left: later full collections walk only what was made after it (`gc.freeze`, as Instagram did).
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect what starting left behind, then keep every surviving object out of later
    collections: they live as long as the process. Call it when a service is ready; calling it
    again freezes what was added since."""
    gc.collect()
    gc.freeze()
