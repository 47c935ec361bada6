"""``python -m bench NAME [--size tiny|small|full] [--runs 3] [options]``.

NAME is one of: throughput, wakeup, relay, history, heartbeat, api,
recovery. ``python -m bench NAME --help`` lists a figure's own options.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

FIGURES = ["throughput", "wakeup", "relay", "history", "heartbeat", "api", "recovery"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in FIGURES:
        print(__doc__, file=sys.stderr)
        return 2
    name = argv.pop(0)
    module = importlib.import_module(f"bench.{name}")
    parser = argparse.ArgumentParser(
        prog=f"python -m bench {name}", description=(module.__doc__ or "").strip()
    )
    parser.add_argument("--size", choices=list(module.SIZES), default="small")
    parser.add_argument("--runs", type=int, default=3, help="rounds; each figure is their median")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="results folder (default bench/results)"
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default=os.environ.get("RUNLANE_BENCH_SYNCHRONOUS_COMMIT", "on"),
        help="set on the benchmark databases alone; off removes the wait for the WAL"
        " flush at each commit (results and plots get a _sync_off suffix)",
    )
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    # Child processes (workers, loaders) inherit it through the environment.
    os.environ["RUNLANE_BENCH_SYNCHRONOUS_COMMIT"] = args.synchronous_commit
    module.main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
