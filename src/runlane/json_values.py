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

_CONTAINERS = (dict, list, tuple)
_NOT_FINITE = "numbers must be finite (no NaN or Infinity)"


def json_problem(value: Any, *, max_depth: int = MAX_DEPTH) -> str | None:
    """Why ``value`` cannot be stored and served as JSON, or None.

    Walks the value without recursion, so a deep one costs no stack. Only
    containers go on the walk's stack; the scalars in a container are
    checked as it is read, the common types first by exact type (a
    submit's input and a handler's output are walked whole: an agent's
    transcript of 100 kB has thousands of strings)."""
    if not isinstance(value, _CONTAINERS):
        return _scalar_problem(value)
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        container, depth = stack.pop()
        if depth >= max_depth:
            return f"values cannot be nested more than {max_depth} levels deep"
        if isinstance(container, dict):
            for key in container:
                if not isinstance(key, str):
                    return "object keys must be strings"
                problem = _string_problem(key)
                if problem:
                    return problem
            children: Any = container.values()
        else:
            children = container
        for child in children:
            kind = type(child)
            if kind is str:
                problem = _string_problem(child)
                if problem:
                    return problem
            elif kind is int or kind is bool or child is None:
                continue
            elif kind is float:
                if not math.isfinite(child):
                    return _NOT_FINITE
            elif isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))
            else:
                problem = _scalar_problem(child)
                if problem:
                    return problem
    return None


def _scalar_problem(item: Any) -> str | None:
    if isinstance(item, str):
        return _string_problem(item)
    if isinstance(item, float):
        return None if math.isfinite(item) else _NOT_FINITE
    if isinstance(item, int | bool) or item is None:
        return None
    return f"a {type(item).__name__} is not a JSON value"


def _string_problem(text: str) -> str | None:
    if "\x00" in text:
        return "text cannot hold NUL characters (\\u0000)"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "text cannot hold unpaired surrogates (\\ud800-\\udfff)"
    return None
