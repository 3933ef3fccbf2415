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
        case msgspec.inspect.IntType():  # within its Meta bounds, or the decoder refuses it
            low = info.ge if info.ge is not None else -(2**63) if info.gt is None else info.gt + 1
            high = info.le if info.le is not None else 2**63 - 1 if info.lt is None else info.lt - 1
            return st.integers(min_value=low, max_value=high)
        case msgspec.inspect.FloatType():  # JSON has no infinity
            low, high = info.gt if info.ge is None else info.ge, info.lt if info.le is None else info.le
            return st.floats(
                min_value=low,
                max_value=high,
                exclude_min=info.gt is not None,
                exclude_max=info.lt is not None,
                allow_nan=False,
                allow_infinity=False,
            )
        case msgspec.inspect.BoolType():
            return st.booleans()
        case msgspec.inspect.StrType() if info.pattern is not None:  # ids: what the decoder accepts
            return st.from_regex(info.pattern, fullmatch=True).filter(lambda s: len(s) <= (info.max_length or 20))
        case msgspec.inspect.StrType():
            return st.text(max_size=20)
        case msgspec.inspect.NoneType():
            return st.none()
        case msgspec.inspect.LiteralType():
            return st.sampled_from(info.values)
        case msgspec.inspect.ListType() | msgspec.inspect.VarTupleType():
            return st.lists(strategy_for(info.item_type), max_size=4)
        case msgspec.inspect.TupleType():
            return st.tuples(*(strategy_for(t) for t in info.item_types))
        case msgspec.inspect.UnionType():
            return st.one_of(*(strategy_for(t) for t in info.types))
        case msgspec.inspect.Metadata():  # Annotated[..., Meta(...)]: its constraints are on the inner type
            return strategy_for(info.type)
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
