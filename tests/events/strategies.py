"""Hypothesis strategies for every event kind, derived from the msgspec type info.

Deriving them from `msgspec.inspect` means a new event kind or field is covered by the
round-trip tests without anyone remembering to write a strategy for it.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

from events.catalogue import AnyEvent

_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_-"


def strategy_for(info: msgspec.inspect.Type) -> st.SearchStrategy[Any]:
    match info:
        case msgspec.inspect.IntType():
            return st.integers(min_value=-(2**63), max_value=2**63 - 1)
        case msgspec.inspect.FloatType():
            return st.floats(allow_nan=False, allow_infinity=False)  # JSON has no infinity
        case msgspec.inspect.BoolType():
            return st.booleans()
        case msgspec.inspect.StrType():
            return st.text(max_size=20)
        case msgspec.inspect.NoneType():
            return st.none()
        case msgspec.inspect.LiteralType():
            return st.sampled_from(info.values)
        case msgspec.inspect.ListType() | msgspec.inspect.VarTupleType():
            return st.lists(strategy_for(info.item_type), max_size=4)
        case msgspec.inspect.UnionType():
            return st.one_of(*(strategy_for(t) for t in info.types))
        case msgspec.inspect.StructType():
            fields = {f.name: strategy_for(f.type) for f in info.fields}
            return st.builds(info.cls, **fields)
        case _:
            raise NotImplementedError(f"no strategy for {info!r}")


def event_strategy() -> st.SearchStrategy[AnyEvent]:
    info = msgspec.inspect.type_info(AnyEvent)
    if not isinstance(info, msgspec.inspect.UnionType):
        raise TypeError("AnyEvent must be a union")
    return st.one_of(*(strategy_for(t) for t in info.types))


def id_strategy() -> st.SearchStrategy[str]:
    return st.text(alphabet=_ID_ALPHABET, min_size=1, max_size=16)
