"""Loads named queries from the ``.sql`` files under ``sql/``."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse_named_queries(text: str) -> dict[str, str]:
    """Splits a file of ``-- name: NAME`` blocks into {NAME: SQL}."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = body.strip()
    return queries


@cache
def named_queries(file_name: str = "queries.sql") -> dict[str, str]:
    text = resources.files("runlane").joinpath(f"sql/{file_name}").read_text(encoding="utf-8")
    return parse_named_queries(text)
