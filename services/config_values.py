"""A setting's raw value (YAML, env text, flag) checked against the type its struct declares.

The declared type is the whole rule: `Annotated[int, msgspec.Meta(ge=1, le=64)]`, a `Literal`,
`X | None`, a string with a `pattern`. msgspec does the checking, and what a setting allows is
said in words from the same declaration (a `pattern` says it through `Meta(extra={"allowed":
...})`, since a regex is no message for a user). Text from env vars and flags is read as JSON
for numbers and choices, taken as is for strings, split at commas for a tuple of strings; a value
never falls back to its default. A field declared secret (`Meta(extra={"secret": True})`) is never
shown, not even in the error that refuses it.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

import msgspec

NONE_WORDS = frozenset({"", "none", "null", "off"})  # env/flag text for "no value" of an optional setting
REDACTED = "<redacted>"  # what is shown of a secret (Meta extra={"secret": True}), even in an error


class ConfigError(ValueError):
    """An invalid setting: names the key, the value, where it came from and what is allowed."""

    def __init__(self, key: str, value: object, source: str, allowed: str) -> None:
        super().__init__(f"invalid setting {key}={value!r} (from {source}): {allowed}")
        self.key = key
        self.value = value
        self.source = source
        self.allowed = allowed


class DeclaredFields:
    """The fields of one msgspec struct type: check a value for one of them, say what it allows."""

    def __init__(self, struct_type: type[msgspec.Struct]) -> None:
        info = msgspec.inspect.type_info(struct_type)
        if not isinstance(info, msgspec.inspect.StructType):
            raise TypeError(f"{struct_type!r} is not a msgspec struct")
        self._hints: dict[str, Any] = typing.get_type_hints(struct_type, include_extras=True)
        self._info = {field.name: field.type for field in info.fields}

    def allowed(self, key: str) -> str:
        """What field `key` accepts, in words."""
        return _in_words(self._info[key], _declared_choices(self._hints[key]))

    def checked(self, key: str, value: object, source: str) -> object:
        """`value` as field `key`'s declared type, or a ConfigError naming key, value, source, what is allowed."""
        try:
            typed = self._from_text(key, value) if isinstance(value, str) else value
            return msgspec.convert(typed, self._hints[key])
        except (msgspec.ValidationError, msgspec.DecodeError):
            shown = REDACTED if self.is_secret(key) else value
            raise ConfigError(key, shown, source, self.allowed(key)) from None

    def is_secret(self, key: str) -> bool:
        """Whether field `key` is declared secret (`Meta(extra={"secret": True})`): never to be shown."""
        info = self._info[key]
        while True:
            match info:
                case msgspec.inspect.Metadata(extra={"secret": True}):
                    return True
                case msgspec.inspect.Metadata():
                    info = info.type
                case _:
                    return False

    def _from_text(self, key: str, text: str) -> object:
        info = _inner(self._info[key])
        if isinstance(info, msgspec.inspect.StrType):
            return text
        if isinstance(info, msgspec.inspect.VarTupleType) and isinstance(
            _inner(info.item_type), msgspec.inspect.StrType
        ):
            return [part.strip() for part in text.split(",") if part.strip()]  # a list of strings, comma-separated
        if isinstance(info, msgspec.inspect.LiteralType) and all(isinstance(v, str) for v in info.values):
            return next((v for v in info.values if str(v).lower() == text.strip().lower()), text)  # debug = DEBUG
        optional = isinstance(info, msgspec.inspect.UnionType) and msgspec.inspect.NoneType() in info.types
        if optional and text.strip().lower() in NONE_WORDS:
            return None
        return msgspec.json.decode(text, type=self._hints[key])


def _inner(info: msgspec.inspect.Type) -> msgspec.inspect.Type:
    return _inner(info.type) if isinstance(info, msgspec.inspect.Metadata) else info


def _declared_choices(hint: Any) -> tuple[object, ...]:
    """The values of the Literal in `hint` in their declared order (msgspec.inspect sorts them)."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    for arg in typing.get_args(hint):
        found = _declared_choices(arg)
        if found:
            return found
    return ()


def _in_words(info: msgspec.inspect.Type, choices: tuple[object, ...]) -> str:
    match info:
        case msgspec.inspect.Metadata(extra={"allowed": str(said)}):
            return said
        case msgspec.inspect.Metadata():
            return _in_words(info.type, choices)
        case msgspec.inspect.IntType(ge=int(low), le=int(high)):
            return f"an integer from {low} to {high}"
        case msgspec.inspect.IntType(ge=int(low)):
            return f"an integer from {low} up"
        case msgspec.inspect.FloatType(gt=float(low), le=float(high)):
            return f"a number greater than {low:g} and at most {high:g}"
        case msgspec.inspect.LiteralType():
            *first, last = (str(value) for value in choices or info.values)
            return f"one of {', '.join(first)} or {last}" if first else last
        case msgspec.inspect.UnionType():
            others = [t for t in info.types if not isinstance(t, msgspec.inspect.NoneType)]
            return " or ".join(["none", *(_in_words(t, choices) for t in others)])
        case _:
            raise TypeError(f"no words for {info!r}: give its Meta extra={{'allowed': ...}}")
