"""What a JSON value must be for runlane to store it and serve it back.

PostgreSQL's jsonb refuses NUL characters and lone surrogates; the API's
serializer stops at about 255 levels of nesting. A value that one of them
would refuse must be refused when it arrives, not after it was stored:
a stored value nobody can read back would break every page that lists it.
"""

from __future__ import annotations

import math
from typing import Any

# Deep enough for any agent's state (a chat transcript is ~10 levels), far
# below the serializer's limit.
MAX_DEPTH = 100

_SCALARS = (str, int, float, bool, type(None))


def json_problem(value: Any, *, max_depth: int = MAX_DEPTH) -> str | None:
    """Why ``value`` cannot be stored and served as JSON, or None.

    Walks the value without recursion, so a deep one costs no stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            problem = _string_problem(item)
            if problem:
                return problem
        elif isinstance(item, float):
            if not math.isfinite(item):
                return "numbers must be finite (no NaN or Infinity)"
        elif isinstance(item, _SCALARS):
            continue
        elif isinstance(item, dict | list | tuple):
            if depth >= max_depth:
                return f"values cannot be nested more than {max_depth} levels deep"
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return "object keys must be strings"
                    stack.append((key, depth + 1))
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        else:
            return f"a {type(item).__name__} is not a JSON value"
    return None


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text cannot hold NUL characters (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text cannot hold unpaired surrogates (\\ud800-\\udfff)"
    return None
