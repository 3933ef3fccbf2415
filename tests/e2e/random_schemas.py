"""A small generator of JSON schemas whose every valid document is short, so a constrained
completion always closes within `max_tokens` (`byte_bound`): strings are capped by maxLength,
integers by minimum/maximum, arrays by maxItems, objects list their properties and forbid others.
Every token is at least one byte, so a completion of a bounded schema needs at most `byte_bound`
tokens plus the EOS the grammar forces at the end. (Floats are left out: their digits are not
bounded by a schema.)"""

from __future__ import annotations

import json
import random
from typing import Any

MAX_CHAR_BYTES = 12  # a character written as a surrogate pair of \\uXXXX escapes
WORDS = ("alpha", "beta", "gamma", "delta", "red", "green", "blue", "x", "y", "z")


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    kinds = ["string", "integer", "boolean", "enum"] + (["object", "array"] if depth < 2 else [])
    kind = "object" if depth == 0 else rng.choice(kinds)
    match kind:
        case "string":
            return {"type": "string", "maxLength": rng.randint(1, 4)}
        case "integer":
            low = rng.randint(-20, 10)
            return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 200)}
        case "boolean":
            return {"type": "boolean"}
        case "enum":
            return {"enum": rng.sample(WORDS, rng.randint(1, 3))}
        case "array":
            return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
        case _:
            keys = rng.sample(WORDS, rng.randint(1, 3))
            properties = {key: random_schema(rng, depth + 1) for key in keys}
            required = [key for key in keys if rng.random() < 0.7] or keys[:1]
            return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def byte_bound(schema: dict[str, Any]) -> int:
    """The most bytes a compact document valid for `schema` can take."""
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"])
    match schema["type"]:
        case "string":
            return 2 + MAX_CHAR_BYTES * schema["maxLength"]
        case "integer":
            return max(len(str(schema["minimum"])), len(str(schema["maximum"])))
        case "boolean":
            return len("false")
        case "array":
            return 2 + schema["maxItems"] * (byte_bound(schema["items"]) + 1)
        case _:
            members = (len(json.dumps(k)) + 1 + byte_bound(v) + 1 for k, v in schema["properties"].items())
            return 2 + sum(members)
