from __future__ import annotations

import pytest

from runlane.queries import named_queries, parse_named_queries


def test_blocks_are_split_by_name() -> None:
    text = "-- preamble\n-- name: first\nSELECT 1;\n\n-- name: second\n-- about it\nSELECT 2;\n"
    assert parse_named_queries(text) == {
        "first": "SELECT 1;",
        "second": "-- about it\nSELECT 2;",
    }


def test_a_name_defined_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_named_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


@pytest.mark.parametrize(
    ("file_name", "module_name"),
    [
        ("queries.sql", "runlane.store"),
        ("lanes.sql", "runlane.lane_store"),
        ("keys.sql", "runlane.keys"),
        ("streams.sql", "runlane.event_hub"),
        ("maintenance.sql", "runlane.maintenance_lock"),
    ],
)
def test_each_shipped_query_is_used_by_its_data_access_module(
    file_name: str, module_name: str
) -> None:
    import importlib
    import inspect

    source = inspect.getsource(importlib.import_module(module_name))
    queries = named_queries(file_name)
    used = {name for name in queries if f'"{name}"' in source}
    assert used == set(queries), f"unused queries: {set(queries) - used}"
