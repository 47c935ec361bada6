"""The worker's and the API's processes collect garbage rarely
(runlane.collector): a busy worker's runs are freed by reference
counting, and the default collector spent a sixth of its CPU scanning
them (BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNS = 2_000


def probe(db_url: str, what: str = str(RUNS), **env: str) -> dict[str, Any]:
    # A process of its own: the collector's settings are the process's.
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.collector_probe", db_url, what],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_worker_collects_garbage_rarely_and_freezes_what_was_loaded(db_url: str) -> None:
    result = probe(db_url)
    assert result["threshold"] == 10_000
    # The libraries and the app, loaded before the worker started.
    assert result["frozen_at_start"] > 1_000
    # Only the first worker of a process freezes; a second adds nothing.
    assert result["frozen_after_second_start"] <= result["frozen_at_start"]
    # 2,000 runs with 100 slots. While its handlers are short the worker
    # also holds up to 200 runs claimed ahead and their outcomes (at most
    # 500 runs in hand), whose objects can reach the 10,000 of a young
    # collection: 1-3 times over these runs (0 with claiming ahead off),
    # against more than 20 with Python's threshold (below). At most one
    # per 400 runs here.
    assert result["young_collections"] <= 5


def test_a_threshold_of_zero_leaves_pythons_collector(db_url: str) -> None:
    result = probe(db_url, RUNLANE_GC_THRESHOLD="0")
    assert result["threshold"] == 700
    assert result["frozen_at_start"] == 0
    # The default threshold collects many times over the same runs.
    assert result["young_collections"] > 20


def test_the_api_process_sets_the_collector_too(db_url: str) -> None:
    assert probe(db_url, "api")["threshold"] == 10_000
    assert probe(db_url, "api", RUNLANE_GC_THRESHOLD="0")["threshold"] == 700
