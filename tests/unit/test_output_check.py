"""The worker's check of a handler's output before it is stored
(``runlane.json_values.json_problem``, as for inputs)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from runlane.json_values import json_problem


@pytest.mark.parametrize("value", [None, True, False, 0, -7, 10**30, 1.5, "", "text ☃"])
def test_plain_scalars_are_fine(value: Any) -> None:
    assert json_problem(value) is None


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "a\x00b"])
def test_scalars_jsonb_refuses_are_caught(value: Any) -> None:
    assert json_problem(value) is not None


@pytest.mark.parametrize(
    ("value", "fine"),
    [
        ({"a": [1, 2.5, "x", None]}, True),
        ({"a": "nul \x00"}, False),
        ([math.nan], False),
        ({"a": {1, 2}}, False),
        (object(), False),
    ],
)
def test_containers_and_other_values_are_encoded_to_check(value: Any, fine: bool) -> None:
    assert (json_problem(value) is None) is fine
