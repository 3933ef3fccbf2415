"""Suggest ids close to one the operator mistyped."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def nearest_ids(wanted: str, known: Iterable[str], limit: int = 5) -> list[str]:
    """The closest known ids by edit similarity; by shared prefix when nothing is close."""
    ids = list(known)
    close = difflib.get_close_matches(wanted, ids, n=limit, cutoff=0.5)
    if close:
        return close
    prefixed = sorted((i for i in ids if i.startswith(wanted[:4])), key=len)
    return prefixed[:limit]


def unknown_id_message(kind: str, wanted: str, known: Iterable[str]) -> str:
    ids = list(known)
    near = nearest_ids(wanted, ids)
    if near:
        return f"unknown {kind} {wanted!r}; nearest: {', '.join(near)}"
    if not ids:
        return f"unknown {kind} {wanted!r}: the log holds no {kind}s"
    return f"unknown {kind} {wanted!r}; the log holds {len(ids)} {kind}s, e.g. {', '.join(sorted(ids)[:5])}"
