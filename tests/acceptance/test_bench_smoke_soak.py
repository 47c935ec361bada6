"""The soak benchmark (bench/soak.py) in its smoke mode: a few seconds, to
keep the script working. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_soak_smoke(db_url: str, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLANE_")}
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "soak.py"),
            "--database-url",
            db_url,
            "--minutes",
            "0.05",
            "--long-runs",
            "50",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "HOT ratio" in result.stdout and "dead tuples" in result.stdout

    document = json.loads(out.read_text())
    assert document["params"]["minutes"] == 0.05
    assert document["machine"]["postgresql"].startswith("PostgreSQL")
    samples = document["samples"]
    assert len(samples) >= 2
    for sample in samples:
        assert {"n_tup_upd", "n_tup_hot_upd", "n_dead_tup", "n_live_tup"} <= set(sample["runs"])
        assert sample["sizes"]["heap_bytes"] > 0 and sample["sizes"]["index_bytes"] > 0
    assert samples[-1]["long_running"] >= 50
    summary = document["summary"]
    for key in ("hot_ratio", "dead_tuple_growth_per_minute", "updates", "lease_renewals"):
        assert key in summary
    assert summary["leases_lost"] == 0
