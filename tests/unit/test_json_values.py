"""What runlane refuses to store: values jsonb or the API could not take back."""

from __future__ import annotations

from typing import Any

import pytest

from runlane.json_values import MAX_DEPTH, json_problem


def nested(levels: int) -> Any:
    value: Any = 1
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def test_ordinary_values_pass() -> None:
    assert json_problem({"messages": [{"role": "user", "content": "hi ☃ 😀"}], "n": 1.5}) is None
    assert json_problem(None) is None
    assert json_problem((1, "a")) is None


def test_nesting_is_limited_at_max_depth() -> None:
    assert json_problem(nested(MAX_DEPTH)) is None
    problem = json_problem(nested(MAX_DEPTH + 1))
    assert problem == f"values cannot be nested more than {MAX_DEPTH} levels deep"


def test_a_very_deep_value_is_refused_without_recursing() -> None:
    # Deeper than Python's recursion limit: a recursive check would crash.
    assert json_problem(nested(100_000)) is not None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("a\x00b", "NUL"),
        ({"k\x00": 1}, "NUL"),
        (["\ud800"], "unpaired surrogates"),
        ({"\udfff": 1}, "unpaired surrogates"),
        (float("nan"), "finite"),
        ([float("inf")], "finite"),
        ({1: "a"}, "keys must be strings"),
        ({"a": {1, 2}}, "a set is not a JSON value"),
        (b"bytes", "a bytes is not a JSON value"),
    ],
)
def test_values_postgres_or_json_cannot_hold_are_named(value: Any, words: str) -> None:
    problem = json_problem(value)
    assert problem is not None and words in problem
