"""A TCP proxy on 127.0.0.1 that can black-hole traffic, to cut a worker off
from PostgreSQL without touching the server."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from psycopg import conninfo as pg_conninfo


class BlackHoleProxy:
    def __init__(self, server_url: str) -> None:
        params = pg_conninfo.conninfo_to_dict(server_url)
        host = str(params.get("host") or "127.0.0.1")
        port = int(params.get("port") or 5432)
        self._params: dict[str, Any] = dict(params)
        self._unix_path = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.black_holed = False
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def url(self) -> str:
        params = dict(self._params)
        params.update(host="127.0.0.1", port=str(self.port))
        return pg_conninfo.make_conninfo(**params)

    def black_hole(self) -> None:
        """From now on, bytes in either direction are silently dropped, as
        in a network partition: nothing fails, everything hangs."""
        self.black_holed = True

    def restore(self) -> None:
        """Ends the partition: open connections are reset (as after a real
        one), new connections work."""
        self.black_holed = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        self.restore()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.black_holed:
            # Accept, then never answer: a connect attempt hangs.
            self._writers.add(writer)
            return
        try:
            if self._unix_path:
                up_reader, up_writer = await asyncio.open_unix_connection(self._unix_path)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.black_holed:
                    continue
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
