"""What runlane refuses to store: values jsonb or the API could not take back."""

from __future__ import annotations

import enum
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


class Tone(enum.StrEnum):
    CALM = "calm"


class Count(enum.IntEnum):
    ONE = 1


class Text(str):
    pass


def transcript(last: Any) -> Any:
    """A value shaped like an agent's state, with ``last`` deep at its end."""
    turns: list[Any] = [
        {"role": "user", "content": f"turn {i} é", "tokens": i, "score": i / 3, "tool": None}
        for i in range(50)
    ]
    turns.append({"role": "tool", "calls": [{"args": ["ok", True, 2.5, {"x": last}]}]})
    return {"messages": turns, "config": {"temperature": 0.2}}


@pytest.mark.parametrize(
    ("last", "words"),
    [
        ("a\x00b", "NUL"),
        (Text("a\x00b"), "NUL"),
        ("\udc00", "unpaired surrogates"),
        (float("-inf"), "finite"),
        ({2: "a"}, "keys must be strings"),
        ([{"k": b"x"}], "a bytes is not a JSON value"),
        (object(), "object is not a JSON value"),
    ],
)
def test_a_problem_deep_in_a_large_value_is_found(last: Any, words: str) -> None:
    problem = json_problem(transcript(last))
    assert problem is not None and words in problem


def test_subclasses_of_json_types_are_checked_as_their_base() -> None:
    assert json_problem(transcript([Tone.CALM, Count.ONE, Text("fine"), True])) is None
