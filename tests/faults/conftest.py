"""Fixtures of the fault tests: ``long_mode`` (``pytest --long``) picks the
large sizes; a test's own ``timeout`` marker is then raised to LONG_TIMEOUT."""

from __future__ import annotations

from pathlib import Path

import pytest

# Per test, in --long mode (the largest, the killer, runs for ~10 minutes).
LONG_TIMEOUT = 3600

_HERE = Path(__file__).parent


@pytest.fixture
def long_mode(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--long"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--long"):
        return
    for item in items:
        if item.path.parent == _HERE and item.get_closest_marker("timeout") is not None:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT), append=False)
