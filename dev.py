#!/usr/bin/env python3
"""Zero-setup entry point: needs only Python >= 3.11 and pip.

    python3 dev.py demo [--once]     # install runlane into .venv, run the demo
    python3 dev.py test [PYTEST ARGS] # install runlane[dev] into .venv, run pytest
    python3 dev.py lint              # ruff format --check, ruff check, mypy

Each command creates ``.venv`` when it is missing and installs the project
into it (editable). A stamp file in ``.venv`` holds the hash of
``pyproject.toml``, so the install is skipped until that file changes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / ("python.exe" if os.name == "nt" else "python")
LINT_PATHS = ["src", "tests", "bench", "dev.py"]

USAGE = """usage: python3 dev.py COMMAND [ARGS]

commands:
  demo [--once]   run the built-in demo (embedded PostgreSQL unless RUNLANE_DATABASE_URL is set)
  test [ARGS]     run the test suite with pytest (ARGS go to pytest)
  lint            ruff format --check, ruff check, mypy
"""


def log(message: str) -> None:
    print(f"dev.py: {message}", file=sys.stderr, flush=True)


def stamp_path(extra: str) -> Path:
    return VENV / f".dev-stamp-{extra}"


def wanted_stamp() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()


def is_installed(extra: str) -> bool:
    path = stamp_path(extra)
    return path.exists() and path.read_text().strip() == wanted_stamp()


def ensure_venv() -> None:
    if PYTHON.exists():
        return
    log(f"creating {VENV.relative_to(ROOT)} with Python {sys.version.split()[0]}")
    venv.EnvBuilder(with_pip=True, clear=VENV.exists()).create(VENV)


def ensure_installed(extra: str) -> None:
    """Installs the project into .venv (``extra`` "base" or "dev") unless the
    stamp says this pyproject.toml was already installed."""
    ensure_venv()
    # The dev install includes the base one.
    if is_installed(extra) or (extra == "base" and is_installed("dev")):
        return
    target = "." if extra == "base" else f".[{extra}]"
    log(f"installing {target} into .venv (editable)")
    command = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check"]
    if os.environ.get("CI"):
        command += ["--no-input", "--progress-bar", "off"]
    subprocess.run([*command, "-e", target], cwd=ROOT, check=True)
    stamp_path(extra).write_text(wanted_stamp() + "\n")


def run(command: list[str]) -> int:
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def exec_(command: list[str]) -> int:
    """Replaces this process where the platform allows (signals then reach
    the command directly); otherwise runs it and returns its code."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":
        return run(command)
    os.chdir(ROOT)
    os.execv(command[0], command)


def cmd_demo(args: list[str]) -> int:
    ensure_installed("base")
    return exec_([str(BIN / "runlane"), "demo", *args])


# Debian packages the tests drive: Chromium for the browser tests (never a
# downloaded browser), wrk for the API benchmark's smoke test.
SYSTEM_TOOLS = {"chromium": Path("/usr/bin/chromium"), "wrk": Path("/usr/bin/wrk")}


def ensure_system_tools() -> None:
    """Installs the missing SYSTEM_TOOLS with apt when this machine allows."""
    missing = [name for name, path in SYSTEM_TOOLS.items() if not path.exists()]
    if not missing:
        return
    apt = shutil.which("apt-get")
    if apt is None or not hasattr(os, "geteuid") or os.geteuid() != 0:
        log(f"no {', '.join(missing)} and no root apt-get: the tests that need them are skipped")
        return
    log(f"installing Debian's {', '.join(missing)} for the tests")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run([apt, "update"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([apt, "install", "-y", *missing], check=True, env=env, stdout=subprocess.DEVNULL)


def cmd_test(args: list[str]) -> int:
    ensure_installed("dev")
    ensure_system_tools()
    return exec_([str(PYTHON), "-m", "pytest", *args])


def cmd_lint(args: list[str]) -> int:
    ensure_installed("dev")
    failed = []
    checks = {
        "ruff format": [str(PYTHON), "-m", "ruff", "format", "--check", *LINT_PATHS],
        "ruff check": [str(PYTHON), "-m", "ruff", "check", *LINT_PATHS],
        "mypy": [str(PYTHON), "-m", "mypy", *args],
    }
    for name, command in checks.items():
        log(f"lint: {name}")
        if run(command) != 0:
            failed.append(name)
    if failed:
        log(f"lint failed: {', '.join(failed)}")
        return 1
    log("lint passed")
    return 0


COMMANDS = {"demo": cmd_demo, "test": cmd_test, "lint": cmd_lint}


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 (dev.py may run on an older python3)
        log(f"runlane needs Python 3.11 or newer; this is {sys.version.split()[0]}")
        return 2
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0 if argv else 2
    command = COMMANDS.get(argv[0])
    if command is None:
        log(f"unknown command {argv[0]!r}")
        print(USAGE, end="", file=sys.stderr)
        return 2
    try:
        return command(argv[1:])
    except subprocess.CalledProcessError as exc:
        log(f"{' '.join(map(str, exc.cmd))} failed with exit code {exc.returncode}")
        return exc.returncode or 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
